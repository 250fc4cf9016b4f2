#!/usr/bin/env bash
# Prepared in session 9 (~6 min; after gpu_next_s10a.sh). Tiles of the T = 65 tree-verify
# attention in the round (DDTree-64, prefix 512), each a $DDTREE_ATTENTION_TABLE trial against
# the default row of this call. Untried so far at a short prefix: 128-key steps (half the
# sequential steps of a program, two stages to fit shared memory), 8 warps on the 64-row tile,
# 128-row tiles on 8 warps, 32-key steps with 4 stages. s7e / s8 / s9 rejected: one part, block_m
# 32, block_new 64, t2's fields, 4 or 8 parts.
# Usage (device tool): bash bench/sessions/gpu_next_s10b.sh -> $OUT/s10b.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
trial() {  # trial NAME CONFIG-JSON
  echo "{\"NVIDIA H200\": [{\"t\": [65, 65], \"g\": 4, \"dh\": 128, \"config\": $2}]}" > "$R/$1.json"
  step "$1" 70 env DDTREE_ATTENTION_TABLE="$R/$1.json" python3 -m bench.bench_round --model qwen3-8b \
    --prompt-len 512 --methods ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$1"
}
step base 70 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/base"
trial bk128 '{"block_k": 128, "num_stages": 2}'
trial w8 '{"num_warps": 8}'
trial m128w8 '{"block_m": 128, "num_warps": 8}'
trial bk32 '{"block_k": 32, "num_stages": 4}'
finish s10b
