#!/usr/bin/env bash
# Session 17 (~8 min): the multi-program rank_select kernel (pallas_kernels/rank_select.py) for
# the tree build's selections (ddtree.RANK_KERNEL_FROM). (1) check_tree with every selection in
# it against plain XLA at B = 64 / 256 / 1024; (2) the build by device time with and without it at
# B = 64 / 256 / 1024, then two other tiles (TIxTJwWARPS) at 1024; (3) rounds with it against
# without: DDTree-256 (from 1000 candidates: the depths and the final) and DDTree-64 (from 200:
# every depth and the final).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s17c.sh
source bench/gpu_step.sh
record_commit
step check 130 python3 -m bench.check_tree --budgets 64,256,1024 --no-beam-kernel
step rank 120 python3 -m bench.bench_tree --budgets 64,256,1024 --count-max 8192 --rank-kernel-from 0,1 \
  --repeats 3 --trace --out "$R/rank"
for t in 64x128w4 32x256w8; do
  step "rank_$t" 50 env DDTREE_RANK_KERNEL_TILE=$t python3 -m bench.bench_tree --budgets 1024 --count-max 8192 \
    --rank-kernel-from 1 --repeats 3 --trace --out "$R/rank_$t"
done
SECS=60 ddtree_rounds r256 ddtree 256 DDTREE_RANK_KERNEL_FROM=1000
SECS=60 ddtree_rounds x256 ddtree 256
SECS=60 ddtree_rounds r64 ddtree 64 DDTREE_RANK_KERNEL_FROM=200
SECS=60 ddtree_rounds x64 ddtree 64
finish s17c
