#!/usr/bin/env bash
# Session 38's last plan (~5 min; not run: the device budget ran out).
# (1) Session 38 moved decode to 2 warps and 3 stages (c98c9a7) on timing rows that skipped the
# on-device checks: bench_kernels' correctness cases (two at T = 1) and check_gpu's T = 1 through
# the target, compiled kernels against XLA, come first.
# (2) The decode merge's tile at short caches. s38d's H200 table had the merge at 2.9 us a call
# over a 1024-key cache (17 parts: 128 columns a program, 32 programs) against 1.9 us from 2048
# keys (33 parts: 64 columns, 64 programs); a 512-token prompt's AR steps have fewer parts still.
# Rows: the default (merge_tile 4096), merge_tile 2048 and 1024, twice, at 512 / 1024 / 2048
# keys, device time.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s38e.sh
source bench/gpu_step.sh
record_commit
step correct 120 python3 bench/bench_kernels.py --ts 1 --no-sweep --split-prefixes "" --no-table --budget-s 110 \
  --out "$R/correct"
step check 120 python3 -m bench.check_gpu --impl auto --layers 2
for P in 512 1024 2048; do
  step merge_$P 60 python3 bench/bench_kernels.py --ts 1 --tile-prefix $P --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --sweep-rows 0,14,15,0,14,15 --budget-s 110 --out "$R/merge_$P"
done
finish s38e
