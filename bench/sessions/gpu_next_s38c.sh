#!/usr/bin/env bash
# Session 38 (~3 min; one call): decode on 2 warps and 3 stages against the default (4 warps, 4
# stages), interleaved twice, at 4096-32768 positions by device time, caches cold. On the H100
# (s38b) 2 warps / 3 stages had the shortest span at every prefix (10.56 / 16.31 / 27.56 / 51.23
# us against 10.71-10.85 / 16.84-16.92 / 28.20-28.31 / 52.40); this is the H200's A/B.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s38c.sh
# --sweep-rows numbers rows of bench_kernels.py's T = 1 list as it was at edc6519: c98c9a7 reordered it.
source bench/gpu_step.sh
record_commit
for P in 4096 8192 16384 32768; do
  step dec_w2s3_$P 90 python3 bench/bench_kernels.py --ts 1 --tile-prefix $P --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --sweep-rows 0,13,0,13 --budget-s 130 --out "$R/dec_w2s3_$P"
done
finish s38c
