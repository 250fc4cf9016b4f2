#!/usr/bin/env bash
# Session 13, fourth call (~2 min): issue 4's decode rows (T = 1, 4k-32k, caches cold) with a
# trace of one chained run: each kernel's device time per call against the call's span, i.e. how
# much of the ~20 us a call that the 4k row pays beyond its bytes is kernels and how much gaps.
# Usage (device tool): bash bench/sessions/gpu_s13_4.sh -> $OUT/s13_4.tar.xz
source bench/gpu_step.sh
record_commit
step decode 150 python3 bench/bench_kernels.py --ts 1 --prefixes 4096,8192,16384,32768 --no-sweep \
  --no-correctness --no-cudnn --no-xla --trace --budget-s 140 --out "$R/decode"
finish s13_4
