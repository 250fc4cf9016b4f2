#!/usr/bin/env bash
# Session 4, call 2: the tree build with the new vocabulary top-k (at most 64 candidates a chunk)
# and pairwise ranking up to 8192 / 16384 candidates; then the attention kernel's split counts
# with cold caches (each call reads its K/V from HBM, not L2), to set KernelConfig's defaults.
# Usage (device tool): bash bench/sessions/gpu_s4_tune.sh -> $OUT/s4_tune.tar.xz   (~5 min)
source bench/gpu_step.sh
step tree 90 python3 -m bench.bench_tree --budgets 64,256,1024 --count-max 8192,16384 --out "$R"
step splits 250 python3 bench/bench_kernels.py --out "$R/kernels" --budget-s 235 --ts 1,65,257 \
  --tile-prefix 0 --split-prefixes 4096,16384,32768 --t-splits 1=16,32,64,128,255 \
  --t-splits 65=2,4,8,14 --t-splits 257=2,4,8 --no-table --cold-mb 160
finish s4_tune
