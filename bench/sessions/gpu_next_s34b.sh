#!/usr/bin/env bash
# Session 34 (~9.5 min; one call, after s34a passed its checks): stacked caches and norm weights
# against the base (per-layer ones, 9721902, bench/.ab_base) on one start, interleaved:
# DDTree-64 and DDTree-256 rounds at prompt 512 (a call and steady). They should take ~1 ms off a
# call (s33c's dispatch probe: ~0.6 for the caches, ~0.45 for the norms) and nothing off a steady
# round.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; see gpu_next_s34a.sh for
# .ab_base): bash bench/sessions/gpu_next_s34b.sh
source bench/gpu_step.sh
record_commit
export SECS=130 ROUNDS=32 PROMPT=512
ddtree_rounds new_a ddtree 64,256
base_rounds base_a ddtree 64,256
ddtree_rounds new_b ddtree 64,256
base_rounds base_b ddtree 64,256
finish s34b
