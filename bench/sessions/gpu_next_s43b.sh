#!/usr/bin/env bash
# Session 43 (~4 min; one call): gpu_next_s43a.sh's two options together, DDTree-255 drafting over
# a 32768-column token map, against DDTree-256 as benchmarked, interleaved twice on one start.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s43b.sh
source bench/gpu_step.sh
record_commit
export SECS=75 ROUNDS=32
for r in a b; do
  ddtree_rounds d256_$r ddtree 256
  ddtree_rounds d255map_$r ddtree 255 --draft-vocab 32768
done
finish s43b
