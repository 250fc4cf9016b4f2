#!/usr/bin/env bash
# Session 42 (~7 min, Hopper; after gpu_next_s41b.sh): DDTree-64 and -256 rounds on this commit (the
# verify kernels' softmax with the scale folded into exp2's argument, bfe131b / a77d8eb) against
# the tree before it, 8949fe7 in bench/.ab_head (recipe in gpu_next_s41b.sh), interleaved base /
# new twice on one machine start, prompt 512.
# Usage (device tool, carry bench/.device_commit and bench/.ab_head):
#   BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s42a.sh
source bench/gpu_step.sh
record_commit
export SECS=100 ROUNDS=32
AB_BASE=bench/.ab_head base_rounds base_a ddtree 64,256
ddtree_rounds new_a ddtree 64,256
AB_BASE=bench/.ab_head base_rounds base_b ddtree 64,256
ddtree_rounds new_b ddtree 64,256
finish s42a
