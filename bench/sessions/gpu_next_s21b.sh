#!/usr/bin/env bash
# Prepared in session 20 for the next session (~8 min; one call). Session 20's key_splits (cN: a
# row block's key steps split over N CTAs, each writing a normalized partial and its rows'
# log2-sum-exp2, merged by one XLA fusion), new and unmeasured: alone at T = 8 over a 4096-token
# prefix (decode-like: issue 4's 80 % at 4k means ~6.4 us for the 8B shape), T = 16 (the
# drafter's block: the unsplit kernel has 8 CTAs there) and 72 (DDTree-64: 40), then DDTree-64
# rounds with the fastest T = 72 config against Triton, and AR at prompt 4096 with its attention
# on the kernel (T = 8 padded) against the Triton decode, same start.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s21b.sh
source bench/gpu_step.sh
record_commit
step ks 200 python3 -m bench.bench_mgpu --ts 8,16,72 --prefixes 512,4096 \
  --configs triton,64x4w2k,64x4w2kc2,64x4w2kc4,64x3w2c2,64x4w1c4,64x4w1c8 --inner 8 --out "$R/ks"
CFG=$(python3 -m bench.pick_mgpu "$R/ks/mgpu.json"); echo "picked: $CFG" | tee "$R/picked.txt"
SECS=90 ddtree_rounds ks64 ddtree 64 DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG="${CFG:-72:64x4w2kc2},64x3w2s"
SECS=80 ddtree_rounds tri64 ddtree 64
# Decode in the round: AR at prompt 4096 pads its one row to 8 where "auto" takes the kernel
# (engine.verify_stage), so the range 8-8 puts AR's attention on it, against the Triton decode.
ar4k() {  # NAME [env...]
  local name=$1; shift
  step "$name" 80 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 4096 --methods ar \
    --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
ar4k ar4k_mgpu DDTREE_MGPU_ATTENTION=8-8 DDTREE_MGPU_CONFIG="${CFG:-8:64x4w1c8},64x3w2s"
ar4k ar4k_triton DDTREE_X=0
finish s21b
