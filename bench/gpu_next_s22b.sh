#!/usr/bin/env bash
# Prepared in session 21 for the next session (~8 min; one call).
# (1) Token maps (--draft-vocab, new in session 21): the draft's LM head cut to 32768 of 151936
#     columns (what a Qwen3 map of the most frequent tokens would hold), DDTree-64 and -256 against
#     the full head, same start. Expected: ~0.22 ms a round less (1.24 GB -> 0.27 GB of head).
# (2) Session 20's gpu_next_s21a.sh, never run: DDTree-256 at prompt 8192 and at batch 2, the
#     default (the Mosaic GPU kernel at T = 264) against DDTREE_MGPU_ATTENTION=off (Triton).
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s22b.sh
source bench/gpu_step.sh
record_commit
rounds() {  # NAME BUDGET SECS [bench_round args...]
  local name=$1 budget=$2 secs=$3; shift 3
  step "$name" "$secs" env DDTREE_X=0 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets "$budget" --rounds 32 --repeats 3 --stage-repeats 0 "$@" --out "$R/$name"
}
rounds dv64 64 60 --draft-vocab 32768
rounds full64 64 60
rounds dv256 256 60 --draft-vocab 32768
rounds full256 256 60
long() {  # NAME [env...]: DDTree-256 at prompt 8192, 16 rounds
  local name=$1; shift
  step "$name" 90 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --methods ddtree \
    --budgets 256 --rounds 16 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
long long_new DDTREE_X=0
long long_old DDTREE_MGPU_ATTENTION=off
batch() {  # NAME [env...]: DDTree-256 at batch 2, prompt 512
  local name=$1; shift
  step "$name" 90 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets 256 --rounds 16 --repeats 3 --stage-repeats 0 --batch 2 --out "$R/$name"
}
batch b2_new DDTREE_X=0
batch b2_old DDTREE_MGPU_ATTENTION=off
finish s22b
