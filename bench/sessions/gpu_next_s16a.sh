#!/usr/bin/env bash
# Prepared in session 15 for the next session (~6 min; gpu_next_s16b.sh has the rounds): (1) the
# final selection by merging the depths' sorted beams (ddtree.FINAL_MERGE_FROM, off until timed) on the device: the same tree as
# XLA + a sort at B = 256 / 1024, then the build by device time with and without it (it replaces
# a 52 us sort at 1024); (2) the select second stage's radix (select_top is latency-bound, ~0.6 us
# a radix round: 4 bits a round halves the rounds) at B = 128 / 256 / 1024.
# Usage (device tool): bash bench/sessions/gpu_next_s16a.sh -> $OUT/s16a.tar.xz
source bench/gpu_step.sh
record_commit
step check_merge 100 env DDTREE_FINAL_MERGE_FROM=1 python3 -m bench.check_tree --budgets 256,1024 --no-beam-kernel
step merge 120 python3 -m bench.bench_tree --budgets 256,1024 --count-max 8192 --final-merge-from 0,1 \
  --repeats 3 --trace --out "$R/merge"
step radix 150 python3 -m bench.bench_tree --budgets 128,256,1024 --count-max 8192 --select-radix 2,4 \
  --repeats 3 --trace --out "$R/radix"
finish s16a
