#!/usr/bin/env bash
# Session 19, call 1 (~8 min): the Mosaic GPU verify-attention kernel (pallas_kernels/
# tree_attention_mgpu.py) on the H200 for the first time: (1) alone against the Triton kernel,
# exactness (NaN-poisoned stale cache, ragged cache_len) and device time at T = 72 / 264 (the
# padded DDTree-64 / 256 verifies), prefixes 512 / 4096, five configs; (2) DDTree-64 / 256 rounds
# with "auto" taking it (verify padded to a multiple of 8) against without, on one start.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s19_1.sh
source bench/gpu_step.sh
record_commit
step mgpu 240 python3 -m bench.bench_mgpu --ts 72,264 --prefixes 512,4096 \
  --configs triton,64x3w2,64x3w1,64x2w2,128x2w1 --out "$R/mgpu"
SECS=150 ddtree_rounds on ddtree 64,256 DDTREE_MGPU_ATTENTION=8-1100
SECS=150 ddtree_rounds off ddtree 64,256 DDTREE_MGPU_ATTENTION=off
finish s19_1
