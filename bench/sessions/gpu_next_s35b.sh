#!/usr/bin/env bash
# Session 35 (~9 min; one call, after s34a passed its checks): session 34's stacked caches and
# norm weights against the base (per-layer ones, 9721902, bench/.ab_base), interleaved new / base /
# new: DDTree-64 and DDTree-256 rounds at prompt 512 (a call and steady); then issue 4's read floor,
# each read seeded by the one before (s33d's first step; s33c's unseeded reads were deduplicated by
# XLA).
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; see gpu_next_s34a.sh for
# .ab_base): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s35b.sh
source bench/gpu_step.sh
record_commit
export SECS=115 ROUNDS=32 PROMPT=512
ddtree_rounds new_a ddtree 64,256
base_rounds base_a ddtree 64,256
ddtree_rounds new_b ddtree 64,256
step read_floor 150 python3 -m bench.probe_read_floor --prefixes 4096,8192,16384 \
  --configs 32x64w4s4,32x64w4s3,32x64w4s2,16x64w4s2,64x64w4s2,16x128w4s2 --out "$R/read_floor"
finish s35b
