#!/usr/bin/env bash
# Session 36 (~9.5 min; one call, for when a machine comes once): issue 4's read floor, seeded
# (s33d's first step, never run: s33c's unseeded reads were deduplicated by XLA), first, since it
# decides whether 80 % of the bytes floor at a 4096-token prefix is reachable by any kernel of the
# decode's shape; then s36a's DDTree-256 rows, new (stacked state with 03aebae's compile fix)
# against the base (9721902), whose "[N s, at M s]" figures test the compile fix; DDTree-64 last.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; see gpu_next_s36a.sh):
#   BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s36b.sh
source bench/gpu_step.sh
record_commit
step read_floor 110 python3 -m bench.probe_read_floor --prefixes 4096,8192 \
  --configs 32x64w4s4,32x64w4s2,16x64w4s2,64x64w4s2,16x128w4s2,16x256w8s2 --out "$R/read_floor"
export ROUNDS=32 PROMPT=512
SECS=150 ddtree_rounds d256_a ddtree 256
SECS=110 base_rounds base256_a ddtree 256
SECS=90 ddtree_rounds d64_a ddtree 64
finish s36b
