#!/usr/bin/env bash
# Session 43 (~5 min; one call): the options issue 3's 9.0 ms leaves the owner, on one machine
# start, interleaved: DDTree-256 as benchmarked (the drafter's full LM head), DDTree-256 drafting
# over a 32768-column token map (--draft-vocab: FR-Spec's drafting, lossless), and DDTree-255
# (256 verify rows: the GEMMs' tiles and the attention's one wave), twice each.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s43a.sh
source bench/gpu_step.sh
record_commit
export SECS=75 ROUNDS=32
for r in a b; do
  ddtree_rounds d256_$r ddtree 256
  ddtree_rounds d256map_$r ddtree 256 --draft-vocab 32768
  ddtree_rounds d255_$r ddtree 255
done
finish s43a
