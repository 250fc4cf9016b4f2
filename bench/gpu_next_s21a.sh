#!/usr/bin/env bash
# Prepared in session 20 for the next session (~9 min; one call). The Mosaic GPU verify kernel
# now serves padded T 257-1032 with its empty-step skip (64x3w2s). Not yet measured:
# (1) a DDTree-256 profile at those defaults: a verify layer's time by kernel at T = 264 (s12_1's
#     figures predate the padding, the kernel and the skip);
# (2) the round at prompt 8192 (issue 4 asks for prefix 512 and 8k) and at batch 2, DDTree-256,
#     the new defaults against DDTREE_MGPU_ATTENTION=off (the Triton kernel), same start.
# (3) is gpu_next_s21b.sh (session 20's key_splits).
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s21a.sh
source bench/gpu_step.sh
record_commit
step prof256 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --out "$R/prof256"
long() {  # NAME [env...]: DDTree-256 at prompt 8192, 16 rounds
  local name=$1; shift
  step "$name" 110 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --methods ddtree \
    --budgets 256 --rounds 16 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
long long_new DDTREE_X=0
long long_old DDTREE_MGPU_ATTENTION=off
batch() {  # NAME [env...]: DDTree-256 at batch 2, prompt 512
  local name=$1; shift
  step "$name" 110 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets 256 --rounds 16 --repeats 3 --stage-repeats 0 --batch 2 --out "$R/$name"
}
batch b2_new DDTREE_X=0
batch b2_old DDTREE_MGPU_ATTENTION=off
finish s21a
