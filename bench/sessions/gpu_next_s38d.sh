#!/usr/bin/env bash
# Session 38 (~6 min; one call): decode's new default (2 warps, 3 stages) against the old (4
# warps, 4 stages), interleaved twice at 4096-32768 positions by device time (s38b/s38c did this
# on H100s), then issue 4's decode table at the new default (1k-32k, kernel + merge span), and on
# an H200 DDTree-256 / -255 on the stacked state (s38a's start: 9.957 / 9.444 a call).
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s38d.sh
source bench/gpu_step.sh
record_commit
for P in 4096 8192 16384 32768; do
  step dec_ab_$P 90 python3 bench/bench_kernels.py --ts 1 --tile-prefix $P --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --sweep-rows 0,1,0,1 --budget-s 130 --out "$R/dec_ab_$P"
done
step dec_table 120 python3 bench/bench_kernels.py --ts 1 --prefixes 1024,2048,4096,8192,16384,32768 --no-sweep \
  --split-prefixes "" --no-correctness --no-cudnn --trace --budget-s 110 --out "$R/dec_table"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  export SECS=75 ROUNDS=32
  ddtree_rounds d256 ddtree 256
  ddtree_rounds d255 ddtree 255
fi
finish s38d
