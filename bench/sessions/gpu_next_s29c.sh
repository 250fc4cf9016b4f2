#!/usr/bin/env bash
# Session 29, third call (~6 min). (1) The landed LONG_CACHE_CONFIGS[72] (64x4w2kc3 at batch 2 from
# 5120 cache positions) with no overrides, against Triton (DDTREE_MGPU_ATTENTION=256-1032), DDTree-64
# at batch 2, prompt 4096, AB. (2) At batch 2 over a short cache (prompt 512, cache 2816) the
# unsplit 64x4w2k (80 CTAs, one wave) ran 10.0 us alone against Triton's 12.9 (s29b): in rounds,
# ABAB against Triton.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s29c.sh
source bench/gpu_step.sh
record_commit
TRI="DDTREE_MGPU_ATTENTION=256-1032"
UNSPLIT="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2k,64x3w2so"
export ROUNDS=32 PROMPT=4096
SECS=90 ddtree_rounds b2p4096_default ddtree 64 --batch 2
SECS=60 ddtree_rounds b2p4096_tri ddtree 64 $TRI --batch 2
export SECS=55 PROMPT=512
ddtree_rounds b2p512_tri1 ddtree 64 --batch 2
ddtree_rounds b2p512_unsplit1 ddtree 64 $UNSPLIT --batch 2
ddtree_rounds b2p512_tri2 ddtree 64 --batch 2
ddtree_rounds b2p512_unsplit2 ddtree 64 $UNSPLIT --batch 2
finish s29c
