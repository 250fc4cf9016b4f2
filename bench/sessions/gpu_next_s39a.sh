#!/usr/bin/env bash
# Session 39 (~9 min; one call). (1) gpu_next_s38e.sh's checks, first: session 38 moved decode to 2
# warps and 3 stages (c98c9a7) on timing rows that skipped the on-device checks, so bench_kernels'
# correctness cases (two at T = 1) and check_gpu's T = 1 through the target (compiled kernels
# against XLA). (2) On an H200, DDTree-256 on this commit against the base 9721902 (bench/.ab_base)
# on one machine start, interleaved base / new twice: session 38's two H200 starts gave 9.957 /
# 9.972 ms a call, against session 36's 9.20-9.44 with no base run beside them.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; the recipe for .ab_base is in
# gpu_next_s34a.sh): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s39a.sh
source bench/gpu_step.sh
record_commit
step correct 120 python3 bench/bench_kernels.py --ts 1 --no-sweep --split-prefixes "" --no-table --budget-s 110 \
  --out "$R/correct"
step check 120 python3 -m bench.check_gpu --impl auto --layers 2
# On any card (session 40: the tool now hands out H100s first): the A/B compares the two commits on
# one start, which is what decides whether the code or the start moved session 38's figure.
export SECS=75 ROUNDS=32
base_rounds b256_a ddtree 256
ddtree_rounds d256_a ddtree 256
base_rounds b256_b ddtree 256
ddtree_rounds d256_b ddtree 256
finish s39a
