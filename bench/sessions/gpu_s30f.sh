#!/usr/bin/env bash
# Session 30 (~6 min; one call). (1) Lossless on the GPU through generate's new path: the shipped
# pair, four prompts of one shape bucket from one --prompt-file (so prompts 2-4 prefill into the
# buffers of the one before, engine.prefill_into), 96 new tokens, AR against DDTree-64,
# DDTree-256 and DFlash: every prompt's token ids must be equal. (2) DDTree-256 with new buffers
# each call (s30e ran it kept). (3) DDTree-64's graph-mode profile with kept buffers (s30a's was
# fresh): what remains of a call's fixed cost.
# s30f ran it in the pair's bf16: prompt 0 (new buffers) and 3 differed at near-ties, README's
# documented bf16 case; s30g (ONLY_LOSSLESS=1 DTYPE=float32, as session 3's suite, with
# JAX_DEFAULT_MATMUL_PRECISION=highest) is the exact check.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s30f.sh
source bench/gpu_step.sh
record_commit
printf '%s\n' 'def fibonacci(n):' 'import os\nimport sys\n\ndef main():' 'class Stack:\n    """A LIFO stack."""' \
  'def quicksort(items):' > "$R/prompts.txt"
gen() {  # NAME ARGS...: generate --json into $R/NAME.json, its stderr in the step's log
  local name=$1; shift
  step "$name" 80 bash -c 'out=$1; shift; python3 -m ddtree_jax.generate --prompt-file "$0" --max-new-tokens 96 --json --dtype "${DTYPE:-auto}" "$@" > "$out"' \
    "$R/prompts.txt" "$R/$name.json" "$@"
}
gen ar --method ar
gen ddtree64 --method ddtree --budget 64
gen ddtree256 --method ddtree --budget 256
gen dflash --method dflash
step compare 20 python3 - "$R" <<'PY'
import json, sys, pathlib
r = pathlib.Path(sys.argv[1])
ids = {}
for name in ("ar", "ddtree64", "ddtree256", "dflash"):
    rows = [json.loads(l) for l in (r / f"{name}.json").read_text().splitlines() if l.strip().startswith("{")]
    ids[name] = [row["token_ids"] for row in rows]
    print(name, len(rows), "prompts", [len(t) for t in ids[name]], "mean acceptance",
          [round(row.get("mean_acceptance", 0), 2) for row in rows])
same = {n: ids[n] == ids["ar"] for n in ids}
print("equal to AR:", same)
sys.exit(0 if all(same.values()) and len(ids["ar"]) == 4 else 1)
PY
if [ "${ONLY_LOSSLESS:-0}" = 1 ]; then finish "${NAME:-s30f}"; exit 0; fi
export ROUNDS=32 PROMPT=512
SECS=70 ddtree_rounds d256_fresh ddtree 256 --fresh-buffers
step prof64 110 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 \
  --rounds 16 --graphs --out "$R/prof64"
finish "${NAME:-s30f}"
