#!/usr/bin/env bash
# Session 17 (~8 min): the multi-program rank_select kernel (pallas_kernels/rank_select.py) for
# the tree build's large selections (ddtree.RANK_KERNEL_FROM). (1) check_tree with every selection
# in it against plain XLA at B = 256 / 1024; (2) the build by device time with and without it at
# B = 128 / 256 / 1024, then its tiles (TIxTJwWARPS) at 1024; (3) DDTree-256 rounds with it from
# 1000 candidates against without, interleaved.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s17c.sh
source bench/gpu_step.sh
record_commit
step check 150 python3 -m bench.check_tree --budgets 256,1024 --no-beam-kernel
step rank 150 python3 -m bench.bench_tree --budgets 128,256,1024 --count-max 8192 --rank-kernel-from 0,1,2000 \
  --repeats 3 --trace --out "$R/rank"
for t in 64x128w4 16x128w4 32x256w8 32x64w4; do
  step "rank_$t" 60 env DDTREE_RANK_KERNEL_TILE=$t python3 -m bench.bench_tree --budgets 1024 --count-max 8192 \
    --rank-kernel-from 1 --repeats 3 --trace --out "$R/rank_$t"
done
SECS=80 ddtree_rounds r256_a ddtree 256 DDTREE_RANK_KERNEL_FROM=1000
SECS=80 ddtree_rounds x256_a ddtree 256
SECS=80 ddtree_rounds r256_b ddtree 256 DDTREE_RANK_KERNEL_FROM=1000
SECS=80 ddtree_rounds x256_b ddtree 256
finish s17c
