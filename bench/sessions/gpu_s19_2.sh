#!/usr/bin/env bash
# Session 19, call 2 (~8 min). s19_1 showed the Mosaic GPU kernel exact on the H200 and ran out of
# step time (the kernel was inlined into every call site: now one jitted callee). (1) compile time
# of n calls in one jit; (2) T = 72 / 264 alone, six configs (two splitting the keys between
# two warpgroups), short chains; (3) DDTree-64 / 256
# rounds with "auto" taking the kernel at the fastest config of (2) per T, against without.
source bench/gpu_step.sh
record_commit
step compile 90 python3 -m bench.probe_mgpu_compile --ns 1,16
step mgpu 240 python3 -m bench.bench_mgpu --ts 72,264 --prefixes 512 --configs triton,64x3w1,64x4w1,64x3w2,128x2w1,64x2w2k,64x4w2k \
  --inner 8 --out "$R/mgpu"
CFG=$(python3 -m bench.pick_mgpu "$R/mgpu/mgpu.json"); echo "picked: $CFG" | tee "$R/picked.txt"
SECS=170 ddtree_rounds on ddtree 64,256 DDTREE_MGPU_ATTENTION=8-1100 DDTREE_MGPU_CONFIG="${CFG:-64x3w1}"
SECS=110 ddtree_rounds off ddtree 64,256 DDTREE_MGPU_ATTENTION=off
finish s19_2
