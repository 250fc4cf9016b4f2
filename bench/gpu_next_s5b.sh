#!/usr/bin/env bash
# Prepared in session 4 (not yet run): the attention kernel with HBM-cold caches (issue 4): the
# tree-verify chunk counts that session 4's sweep did not reach, the table at the defaults, then
# the shipped pair's float32 T=257 verify (8 ms a round in session 3's suite: its tiles in f32).
# Usage (device tool): bash bench/gpu_next_s5b.sh -> $OUT/s5b.tar.xz   (~9 min)
source bench/gpu_step.sh
# ~9 s a cold point (session 4): correctness ~55 s + 14 sweep points + 6 table rows (pallas and xla)
step kernels 330 python3 bench/bench_kernels.py --out "$R/kernels" --budget-s 320 --ts 65,257,1 \
  --prefixes 4096,32768 --tile-prefix 0 --split-prefixes 4096,32768 --t-splits 65=2,4,8,14 \
  --t-splits 257=2,4,8 --t-splits 1=8 --no-cudnn --no-extra --cold-mb 160
step f32 170 python3 bench/bench_kernels.py --out "$R/f32" --budget-s 160 --heads 4,2,64 --dtype float32 \
  --ts 65,257 --prefixes 1024 --tile-prefix 1024 --split-prefixes 1024 --t-splits 65=1,2,4 \
  --t-splits 257=1,2,4 --no-cudnn --no-extra --cold-mb 0
finish s5b
