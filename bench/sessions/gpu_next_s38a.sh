#!/usr/bin/env bash
# Session 38 (~9 min; one call): (1) issue 4's decode at 4096 and 8192 cache positions on 64 and
# 128 chunks with 1-2 stages and 2-4 warps (bench_kernels' T = 1 tile list; session 36 tried 64
# chunks only on the default 4-stage ring, one program an SM, while a bare read was fastest on
# 64 chunks of 64 keys, 2 stages); kernel + merge by device time, caches cold. (2) DDTree-256 and
# DDTree-255 on the stacked state (9.20-9.44 a call in session 36; -255 not run since session 26).
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s38a.sh
source bench/gpu_step.sh
record_commit
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv > "$R/gpu.txt" 2>&1
for P in 4096 8192; do
  step dec_tiles_$P 170 python3 bench/bench_kernels.py --ts 1 --tile-prefix $P --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --budget-s 160 --out "$R/dec_tiles_$P"
done
export SECS=75 ROUNDS=32
ddtree_rounds d256 ddtree 256
ddtree_rounds d255 ddtree 255
finish s38a
