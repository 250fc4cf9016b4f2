#!/usr/bin/env bash
# Session 38 (~6 min; one call): decode's ring depth over long caches. s38a's tile sweep had 3
# stages at 8192 positions 0.8 us faster than the default 4 (11.35 + 1.88 against 12.15 + 1.89
# us), a tie at 4096; here the default, 3 stages, 3 stages on 2 warps and 2 warps, then the
# default and 3 stages again (the spread), at 4096-32768 positions, by device time, caches cold.
# Then DDTree-256 / -255 on this start (s38a's start: 9.957 / 9.444 a call).
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s38b.sh
# --sweep-rows numbers rows of bench_kernels.py's T = 1 list as it was at 43a6856: c98c9a7 reordered it.
source bench/gpu_step.sh
record_commit
for P in 4096 8192 16384 32768; do
  step dec_depth_$P 90 python3 bench/bench_kernels.py --ts 1 --tile-prefix $P --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --sweep-rows 0,2,13,1,0,2 --budget-s 130 --out "$R/dec_depth_$P"
done
export SECS=75 ROUNDS=32
ddtree_rounds d256 ddtree 256
ddtree_rounds d255 ddtree 255
finish s38b
