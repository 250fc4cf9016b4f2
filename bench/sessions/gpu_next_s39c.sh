#!/usr/bin/env bash
# Session 39 (~8 min; one call): issue 4's verify table with the kernels the round runs. The last
# full B = 64 / 256 table over 1k-32k (session 4) timed the Triton kernel; since sessions 19-28 the
# round's T = 65 and 257 verify runs the Mosaic GPU kernel at 72 / 264 rows, timed only at a few
# prefixes (bench_mgpu). bench_kernels' engine column (this commit) times attention(impl="auto")
# at the engine's verify rows beside the Triton kernel, XLA and cuDNN, HBM-cold caches, device span.
# Prefixes in the order issue 4 needs them most, as a step may run out of its budget.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s39c.sh
source bench/gpu_step.sh
record_commit
for T in 65 257; do
  step table_$T 260 python3 bench/bench_kernels.py --ts $T --prefixes 4096,8192,32768,1024,16384,2048 --no-sweep \
    --split-prefixes "" --no-correctness --budget-s 240 --out "$R/table_$T"
done
finish s39c
