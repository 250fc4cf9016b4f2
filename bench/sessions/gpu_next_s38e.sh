#!/usr/bin/env bash
# Session 38's last plan (~2.5 min; not run: the device budget ran out): the decode merge's tile
# at short caches. s38d's H200 table had the merge at 2.9 us a call over a 1024-key cache (17
# parts: 128 columns a program, 32 programs) against 1.9 us from 2048 keys (33 parts: 64
# columns, 64 programs); a 512-token prompt's AR steps have fewer parts still. Rows: the default
# (merge_tile 4096), merge_tile 2048 and 1024, twice, at 512 / 1024 / 2048 keys, device time.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s38e.sh
source bench/gpu_step.sh
record_commit
for P in 512 1024 2048; do
  step merge_$P 60 python3 bench/bench_kernels.py --ts 1 --tile-prefix $P --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --sweep-rows 0,14,15,0,14,15 --budget-s 110 --out "$R/merge_$P"
done
finish s38e
