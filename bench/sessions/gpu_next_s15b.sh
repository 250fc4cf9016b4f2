#!/usr/bin/env bash
# Prepared in session 14 for the next session (~6 min): (1) the ancestor mask at 17 / 65 slots by
# device time, square (the default below 257: a 13.6 us GEMM a build at B = 64 in session 14's
# trace) against chain; (2) decode tiles at 4k by device span (session 14's 32-chunk rule with other
# key blocks / warps / stages: 7.8 us of kernel + 1.9 of merge for a 5.1 us floor), then the best
# at 8k with 32 chunks.
# Usage (device tool): bash bench/sessions/gpu_next_s15b.sh -> $OUT/s15b.tar.xz
source bench/gpu_step.sh
record_commit
step anc 120 python3 -m bench.bench_tree --budgets 16,64 --count-max 8192 --ancestor-impl square,chain --trace --out "$R/anc"
step dectiles 220 python3 bench/bench_kernels.py --ts 1 --tile-prefix 4096 --split-prefixes 8192 \
  --t-splits 1=32 --no-table --no-correctness --trace --budget-s 200 --out "$R/dectiles"
finish s15b
