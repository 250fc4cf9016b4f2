#!/usr/bin/env bash
# Prepared in session 28 for the next session (~7 min; one call). DDTree-64 at batch 2 over long
# caches: ONE_WAVE_CONFIGS[72] (64x4w2kc3) is two waves there (240 CTAs) and costs 0.31 ms a call
# at prompt 512 (s28f), but at prompt 4096 it ran 8.122 against Triton's 8.329 on another start
# (s28b / s28f, no same-start pair). Triton against c3 forced, ABAB at prompt 4096, AB at 8192.
# If c3 wins both, a batch-2 long-cache entry for T = 72 needs long_cache_config to accept a
# two-wave first launch for it (today: the first launch must fit one wave).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s29a.sh
source bench/gpu_step.sh
record_commit
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=60 ROUNDS=32 PROMPT=4096
# A cold machine's first run compiles from nothing (s28f: 50 s ran out), hence 90 s for it.
SECS=90 ddtree_rounds b2p4096_tri1 ddtree 64 --batch 2
ddtree_rounds b2p4096_c3a ddtree 64 $C3 --batch 2
ddtree_rounds b2p4096_tri2 ddtree 64 --batch 2
ddtree_rounds b2p4096_c3b ddtree 64 $C3 --batch 2
export SECS=70 PROMPT=8192
ddtree_rounds b2p8192_tri ddtree 64 --batch 2
ddtree_rounds b2p8192_c3 ddtree 64 $C3 --batch 2
finish s29a
