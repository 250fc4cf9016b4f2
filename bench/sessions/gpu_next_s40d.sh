#!/usr/bin/env bash
# Session 40 (~3.5 min): the on-device checks after decode's merge tile moved to 2048: bench_kernels'
# correctness cases (T = 1 merged over 4103 keys among them) and check_gpu's target layers
# (compiled kernels against XLA, T = 1 at prefixes 0 / 600 / 8192 among them).
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s40d.sh
source bench/gpu_step.sh
record_commit
step correct 110 python3 bench/bench_kernels.py --ts 1 --no-sweep --split-prefixes "" --no-table --budget-s 100 \
  --out "$R/correct"
step check 120 python3 -m bench.check_gpu --impl auto --layers 2
finish s40d
