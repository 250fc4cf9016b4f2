#!/usr/bin/env bash
# Session 20, call 2 (~8 min). (1) check_gpu --impl auto: the target's forward with "auto"
# attention (the Mosaic GPU kernel at T = 264) against XLA, at the default config and at
# 64x3w2sp (skip_empty + the new pingpong schedule). (2) The kernel alone at T = 72 / 264 / 1032:
# pingpong (p), skip_empty (s, unmeasured since session 19), 64x2w1 (two CTAs an SM, if the
# registers allow). (3) DDTree-256 rounds with the fastest config at 264 against the default.
source bench/gpu_step.sh
record_commit
step check 100 python3 -m bench.check_gpu --impl auto --layers 2
step check_sp 90 env DDTREE_MGPU_CONFIG=64x3w2sp python3 -m bench.check_gpu --impl auto --layers 2
step mgpu 200 python3 -m bench.bench_mgpu --ts 72,264,1032 --prefixes 512 \
  --configs triton,64x3w2,64x3w2p,64x3w2s,64x3w2sp,64x2w1,64x4w2k,64x4w2ks --inner 8 --out "$R/mgpu"
CFG=$(python3 -m bench.pick_mgpu "$R/mgpu/mgpu.json"); echo "picked: $CFG" | tee "$R/picked.txt"
SECS=100 ddtree_rounds picked ddtree 256 DDTREE_MGPU_CONFIG="${CFG:-64x3w2sp}"
SECS=90 ddtree_rounds default ddtree 256
finish s20_2
