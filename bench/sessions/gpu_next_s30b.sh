#!/usr/bin/env bash
# Prepared in session 29 (~3 min): where DDTree-64's key split starts to pay at batch 2
# (LONG_CACHE_MIN_SEQ = 5120 rules it): prompt 2048 (cache 4352), Triton against c3 forced, AB.
# s28f / s29a-b: +0.31 ms a call at cache 2816 (prompt 512), -0.13 to -0.37 from 6400.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s30b.sh
source bench/gpu_step.sh
record_commit
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=75 ROUNDS=32 PROMPT=2048
SECS=95 ddtree_rounds b2p2048_tri ddtree 64 --batch 2
ddtree_rounds b2p2048_c3 ddtree 64 $C3 --batch 2
finish s30b
