#!/usr/bin/env bash
# Session 14, call 1: decode prefix chunks at 4k / 8k by device span (gpu_next_s14a.sh), and the
# tree build's kernels by device time at B = 64 / 256 / 1024 (bench_tree --trace, new).
# Usage (device tool): bash bench/sessions/gpu_s14_1.sh -> $OUT/s14_1.tar.xz
source bench/gpu_step.sh
record_commit
step splits 110 python3 bench/bench_kernels.py --ts 1 --split-prefixes 4096,8192 --t-splits 1=8,16,32,64 \
  --tile-prefix 0 --no-table --no-correctness --trace --budget-s 100 --out "$R/splits"
step tree 150 python3 -m bench.bench_tree --budgets 64,256,1024 --count-max 8192 --trace --out "$R/tree"
finish s14_1
