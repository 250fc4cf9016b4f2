#!/usr/bin/env bash
# Prepared in session 10 for the next session's first call (~9 min). The vocabulary top-k's
# threshold first stage (pallas_kernels.chunk_topk, impl "threshold", built in session 10, never
# run on a GPU): the max-extraction kernel it would replace is 0.105 ms of a DDTree-64 round
# (s10a profile), ~40x its read of the logits.
# (1) bench_tree: the first stage alone (128 chunks keeping 64, extraction p vs threshold t; 64
#     wider chunks; 128 keeping K) and the whole build with each first stage, B = 16-1024.
# (2) DDTree-64 / 256 rounds, default then DDTREE_VOCAB_STAGE1=threshold, twice (interleaved).
# (3) DDTree-128 with the one-hot selection up to 100000 (B = 128's n * P is 82560) vs default.
# Usage (device tool): bash bench/gpu_next_s11a.sh -> $OUT/s11a.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step tree_default 100 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 \
  --variants 128x64p,128x64t,64x64t,128x0t --out "$R/tree_default"
step tree_threshold 80 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --stage1 threshold \
  --out "$R/tree_threshold"
rnd() {  # rnd NAME BUDGETS [env...]
  local name=$1 budgets=$2; shift 2
  step "$name" 100 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets "$budgets" --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base1 64,256 DDTREE_X=0
rnd thr1 64,256 DDTREE_VOCAB_STAGE1=threshold
rnd base2 64,256 DDTREE_X=0
rnd thr2 64,256 DDTREE_VOCAB_STAGE1=threshold
rnd b128 128 DDTREE_X=0
rnd b128_onehot 128 DDTREE_SELECT_ONEHOT_MAX=100000
finish s11a
