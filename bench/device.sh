#!/usr/bin/env bash
# The benchmarks on a device machine: one script, a mode and its arguments. Run from the
# repository root. On the device every mode writes under $OUT (the folder the device tool brings
# back; out/device here): a folder per mode with its JSON, a .log per command, and commit.txt.
#
# Here, before a device call (then pass the paths in the device tool's `carry`):
#   bash bench/device.sh stamp                  # this tree's commit -> bench/.device_commit
#   bash bench/device.sh base COMMIT [DIR]      # COMMIT's code as a base tree in DIR (bench/.ab_base)
# On the device:
#   bash bench/device.sh ab [DIR] [ARGS...]     # the 8B rounds (AB_ROUNDS below) of the base tree DIR
#                                               # and of this tree, alternately: base, head, base, head;
#                                               # ARGS override, e.g. --methods ddtree --budgets 255,256
#   bash bench/device.sh suite|round|kernels|tree [ARGS...]   # python -m bench MODE --out $OUT/MODE ARGS
#   bash bench/device.sh check [ARGS...]        # check-gpu ARGS (compiled kernels against XLA), check-tree
#   bash bench/device.sh train [DATA]           # the shipped pair's training recipe, ~9 minutes (DATA:
#                                               # the corpus, default carry/train_data/pystdlib-3.11.7.jsonl.xz)
#   bash bench/device.sh COMMAND [ARGS...]      # any other `python -m bench COMMAND`
# A call cut at the device tool's time limit keeps what $OUT holds: the tools rewrite their JSON
# after every row.
set -uo pipefail
export PYTHONUNBUFFERED=1
AB_ROUNDS=(--model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree --budgets 64,256 --rounds 32 --repeats 3
           --stage-repeats 0)

commit() {  # the device copy has no usable .git: bench/.device_commit (stamp) names the tree
  if [ -f bench/.device_commit ]; then cat bench/.device_commit
  else git describe --always --dirty 2>/dev/null || echo unknown; fi
}

run() {  # run NAME CMD...: CMD's output to the terminal and to $OUT/NAME.log
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  "$@" 2>&1 | tee "$OUT/$name.log"
  return "${PIPESTATUS[0]}"
}

mode=${1:-}; shift || true
case $mode in
  ""|-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  stamp)
    git describe --always --dirty > bench/.device_commit && echo "bench/.device_commit: $(cat bench/.device_commit)"
    exit 0 ;;
  base)
    rev=${1:?usage: bash bench/device.sh base COMMIT [DIR]}; dir=${2:-bench/.ab_base}
    git rev-parse --verify --quiet "$rev^{commit}" > /dev/null \
      || { echo "device.sh: $rev is not a commit" >&2; exit 2; }
    # older trees kept the kernels in a top-level pallas_kernels/
    paths=()
    for p in ddtree_jax pallas_kernels bench convert; do git cat-file -e "$rev:$p" 2>/dev/null && paths+=("$p"); done
    rm -rf "$dir" && mkdir -p "$dir" && git archive "$rev" "${paths[@]}" | tar -x -C "$dir"
    rm -rf "$dir/bench/results" "$dir/bench/sessions" "$dir/ddtree_jax/default_model"  # the carry's 64 MiB
    git rev-parse --short "$rev" > "$dir/.commit"
    echo "$dir: $(cat "$dir/.commit"), $(du -sh "$dir" | cut -f1); pass it in the device tool's carry"; exit 0 ;;
esac

OUT=${OUT:-out/device}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) && echo "$(commit)" > "$OUT/commit.txt"
case $mode in
  ab)
    base=bench/.ab_base; if [ $# -gt 0 ] && [[ $1 != -* ]]; then base=$1; shift; fi
    [ -d "$base/bench" ] \
      || { echo "device.sh: no base tree in $base (bash bench/device.sh base COMMIT $base)" >&2; exit 2; }
    echo "base $(cat "$base/.commit" 2>/dev/null || echo unknown)" >> "$OUT/commit.txt"
    mkdir -p "$OUT/ab"
    for i in 1 2; do  # python -m bench.bench_round: the entry every tree has, old ones too
      run "ab/base_$i" bash -c 'cd "$0" && PYTHONPATH=. exec python3 -m bench.bench_round "$@"' "$base" \
        "${AB_ROUNDS[@]}" "$@" --out "$OUT/ab/base_$i"
      run "ab/head_$i" python3 -m bench.bench_round "${AB_ROUNDS[@]}" "$@" --out "$OUT/ab/head_$i"
    done
    python3 - "$OUT/ab" <<'EOF'
import json, pathlib, sys
rows = {}
runs = pathlib.Path(sys.argv[1]).glob("*_[12]/round_*.json")
for f in sorted(runs, key=lambda f: (f.parent.name[-1], f.parent.name)):  # base_1, head_1, base_2, head_2
    for r in json.loads(f.read_text())["rows"]:
        rows.setdefault(f"{r['method']} B={r['budget']} P={r.get('prompt_len')}", []).append(
            f"{f.parent.name} {r['round_ms_median']:.3f} / {r['round_ms_steady']:.3f}")
print("ms a round, a call / steady:")
for key, runs in rows.items():
    print(f"  {key:20s} " + ", ".join(runs))
EOF
    ;;
  suite) run suite python3 -m bench suite --commit "$(commit)" --out "$OUT/suite" "$@" ;;
  round|kernels|tree) run "$mode" python3 -m bench "$mode" --out "$OUT/$mode" "$@" ;;
  check)
    run check_gpu python3 -m bench check-gpu "$@"; rc=$?
    run check_tree python3 -m bench check-tree || rc=$?
    exit "$rc" ;;
  train)
    data=${1:-carry/train_data/pystdlib-3.11.7.jsonl.xz}; work=/tmp/ddtree_train
    [ -f "$data" ] || { echo "device.sh: corpus $data not found; carry it and pass its path" >&2; exit 2; }
    common=(--data "$data" --force --steps 100000 --batch-size 64 --seq-len 512 --lr 2e-3 --warmup 200
            --min-lr-ratio 0.1 --weight-decay 0.1 --log-every 50 --eval-every 250 --final-eval-sequences 0
            --ckpt-every 0 --token-cache "$work/tokens")
    run train_target python3 -m ddtree_jax.train target "${common[@]}" --out "$work/target" --time-budget 250 \
      --tokenizer ddtree_jax/default_model/tokenizer --eval-sequences 128 || exit 1
    run train_drafter python3 -m ddtree_jax.train drafter "${common[@]}" --target "$work/target/hf" \
      --out "$work/draft" --time-budget 230 --layers 2 --block-size 16 --anchors 32 --gamma 7 --labels distill \
      --eval-sequences 64 --eval-anchors 8 || exit 1
    mkdir -p "$OUT/target" "$OUT/draft"
    cp "$work/target/hf/"{model.safetensors,config.json,generation_config.json} "$OUT/target/"
    cp "$work/draft/hf/"{model.safetensors,config.json} "$OUT/draft/"
    cp "$work/target/metrics.json" "$OUT/target_metrics.json"
    cp "$work/draft/metrics.json" "$OUT/draft_metrics.json" ;;
  *) run "$mode" python3 -m bench "$mode" "$@" ;;
esac
