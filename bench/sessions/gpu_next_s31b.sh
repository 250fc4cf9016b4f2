#!/usr/bin/env bash
# Prepared in session 30 for the next session (~7 min; one call): the second version of the
# one-kernel merge of the key shares (config suffix m, pallas_kernels/split_merge.py). s30a timed
# the first at 4.3 us a layer against XLA's two fusions' 1.6 + 1.2 at T = 72; this one gathers
# each (token, head)'s log2-sum-exp2 once instead of once per column, with twice the programs.
# Alone (T = 72 c3 against c3m, T = 264 t8 against t8m), then DDTree-64 rounds ABAB at prompt
# 512. If c3m wins, make m part of ONE_WAVE_CONFIGS[72] and LONG_CACHE_CONFIGS[72] (and tN's
# where t8m wins), and update README's m line.
# Session 31 added the dispatch probe and made the rounds depend on the kernel alone.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s31b.sh
source bench/gpu_step.sh
record_commit
step alone 110 python3 -m bench.bench_mgpu --inner 8 --ts 72 --prefixes 512,4096 \
  --configs 64x4w2kc3,64x4w2kc3m --out "$R/alone"
step alone264 70 python3 -m bench.bench_mgpu --inner 8 --ts 264 --prefixes 4096 \
  --configs 64x4w2kst8,64x4w2kst8m --out "$R/alone264"
# Session 31 added: where a call's fixed ~3.4 ms goes (s31a: 2.2 ms from the call's start to the
# loop's first thunk, 1.2 ms after the loop's end): 0-round calls and identities over the same arguments
step dispatch 100 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
# the rounds only if c3m's kernel + merge beat c3's at T = 72 (busy us, both prefixes)
if python3 - "$R/alone/mgpu.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
busy = {(r["prefix"], r["config"]): r["busy_us"] for r in rows}
wins = [busy[(p, "64x4w2kc3m")] < busy[(p, "64x4w2kc3")] for p in (512, 4096)]
print("c3m wins alone at prefix 512, 4096:", wins)
sys.exit(0 if all(wins) else 1)
PY
then
  M="DDTREE_MGPU_CONFIG=72:64x4w2kc3m,64x3w2so"
  export SECS=65 ROUNDS=32 PROMPT=512
  SECS=90 ddtree_rounds d64_default1 ddtree 64
  ddtree_rounds d64_m1 ddtree 64 $M
  ddtree_rounds d64_default2 ddtree 64
  ddtree_rounds d64_m2 ddtree 64 $M
fi
finish s31b
