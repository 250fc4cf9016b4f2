#!/usr/bin/env bash
# Prepared in session 10 (~7 min; after gpu_next_s11a.sh). (1) DDTree-64 / 256 rounds, default
# then DDTREE_VOCAB_STAGE1=threshold (set it to threshold:rBITSwWARPS if s11a found a better
# option), twice, interleaved. (2) DDTree-128 with the one-hot selection up to 100000 (B = 128's
# n * P is 82560) vs the default (20000, which B = 128 exceeds).
# Usage (device tool): bash bench/sessions/gpu_next_s11b.sh [STAGE1] -> $OUT/s11b.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
STAGE1=${1:-threshold}
rnd() {  # rnd NAME BUDGETS [env...]
  local name=$1 budgets=$2; shift 2
  step "$name" 100 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets "$budgets" --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base1 64,256 DDTREE_X=0
rnd thr1 64,256 DDTREE_VOCAB_STAGE1="$STAGE1"
rnd base2 64,256 DDTREE_X=0
rnd thr2 64,256 DDTREE_VOCAB_STAGE1="$STAGE1"
rnd b128 128 DDTREE_X=0
rnd b128_onehot 128 DDTREE_SELECT_ONEHOT_MAX=100000
finish s11b
