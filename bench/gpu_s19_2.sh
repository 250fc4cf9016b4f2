#!/usr/bin/env bash
# Session 19, call 2 (~7 min): s19_1 ran out of step time (each Mosaic GPU kernel instance of a
# chain compiles on its own, ~1.5 s): T = 264 alone with short chains, then DDTree-256 rounds
# with the kernel (one budget, a longer limit for the compile) against without.
source bench/gpu_step.sh
record_commit
step compile 100 python3 -m bench.probe_mgpu_compile --ns 1,4,16
step mgpu264 150 python3 -m bench.bench_mgpu --ts 264 --prefixes 512 --configs triton,64x3w1,64x3w2 --inner 8 \
  --out "$R/mgpu264"
SECS=200 ddtree_rounds on256 ddtree 256 DDTREE_MGPU_ATTENTION=8-1100 DDTREE_MGPU_CONFIG=64x3w1
SECS=100 ddtree_rounds off256 ddtree 256 DDTREE_MGPU_ATTENTION=off
finish s19_2
