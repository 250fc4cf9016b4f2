#!/usr/bin/env bash
# Session 41 (~6 min; one call, on an H200 if one comes): DDTree-256 on this commit against the base
# 9721902 (bench/.ab_base) on one machine start, interleaved base / new twice. gpu_next_s39a.sh's
# second half alone (its checks ran in session 40 and gpu_next_s40d.sh repeats them).
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; the recipe for .ab_base is in
# gpu_next_s34a.sh): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s41a.sh
source bench/gpu_step.sh
record_commit
export SECS=75 ROUNDS=32
base_rounds b256_a ddtree 256
ddtree_rounds d256_a ddtree 256
base_rounds b256_b ddtree 256
ddtree_rounds d256_b ddtree 256
finish s41a
