#!/usr/bin/env bash
# Prepared in session 20 for the next session (~6 min; one call). Session 20's key_splits (cN: a
# row block's key steps split over N CTAs, each writing a normalized partial and its rows'
# log2-sum-exp2, merged by one XLA fusion), new and unmeasured: alone at T = 8 over a 4096-token
# prefix (decode-like: issue 4's 80 % at 4k means ~6.4 us for the 8B shape), T = 16 (the
# drafter's block: the unsplit kernel has 8 CTAs there) and 72 (DDTree-64: 40), then DDTree-64
# rounds with the fastest T = 72 config against Triton, same start.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s21b.sh
source bench/gpu_step.sh
record_commit
step ks 200 python3 -m bench.bench_mgpu --ts 8,16,72 --prefixes 512,4096 \
  --configs triton,64x4w2k,64x4w2kc2,64x4w2kc4,64x3w2c2,64x4w1c4,64x4w1c8 --inner 8 --out "$R/ks"
CFG=$(python3 -m bench.pick_mgpu "$R/ks/mgpu.json"); echo "picked: $CFG" | tee "$R/picked.txt"
SECS=90 ddtree_rounds ks64 ddtree 64 DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG="${CFG:-72:64x4w2kc2},64x3w2s"
SECS=80 ddtree_rounds tri64 ddtree 64
finish s21b
