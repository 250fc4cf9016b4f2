#!/usr/bin/env bash
# Prepared in session 13 for the next session (~1.5 min; s13 had no device time left): decode prefix chunks at 4k and 8k by device span (the trace),
# not wall time (s13_4: the chain's wall time carries ~9 us a call of dispatch at --inner 20).
# Usage (device tool): bash bench/gpu_next_s14a.sh -> $OUT/s14a.tar.xz
source bench/gpu_step.sh
record_commit
step splits 110 python3 bench/bench_kernels.py --ts 1 --split-prefixes 4096,8192 --t-splits 1=8,16,32,64 \
  --tile-prefix 0 --no-table --no-correctness --trace --budget-s 100 --out "$R/splits"
finish s14a
