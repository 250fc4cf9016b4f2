#!/usr/bin/env bash
# Session 17 (~5 min): rank_select with an elementwise accumulator (s17c's kernel reduced every
# chunk: 56 us a depth at B = 1024 against XLA's 19.5). (1) check_tree with every selection in it at
# B = 256 / 1024; (2) the build by device time with it off, on from 1 and from 2000 candidates
# (B = 256: only the final selection) at B = 256 / 1024, then two other tiles at 1024;
# (3) DDTree-256 rounds with it from 1000 against without; (4) DDTree-16 / 64 rounds of this tree.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s17d.sh
source bench/gpu_step.sh
record_commit
step check 90 python3 -m bench.check_tree --budgets 256,1024 --no-beam-kernel
step rank 80 python3 -m bench.bench_tree --budgets 256,1024 --count-max 8192 --rank-kernel-from 0,1,2000 \
  --repeats 3 --trace --out "$R/rank"
for t in 64x128w4 32x256w8; do
  step "rank_$t" 30 env DDTREE_RANK_KERNEL_TILE=$t python3 -m bench.bench_tree --budgets 1024 --count-max 8192 \
    --rank-kernel-from 1 --repeats 3 --trace --out "$R/rank_$t"
done
SECS=50 ddtree_rounds r256 ddtree 256 DDTREE_RANK_KERNEL_FROM=1000
SECS=50 ddtree_rounds x256 ddtree 256
SECS=70 ddtree_rounds x16_64 ddtree 16,64
finish s17d
