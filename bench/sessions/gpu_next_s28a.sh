#!/usr/bin/env bash
# Prepared in session 27 for the next session (~8 min; one call). Session 27 made
# LONG_CACHE_CONFIGS the default from 5120 cache positions (tree_attention_mgpu): the tail split
# at T = 264 (timed at prompts 4096 / 8192) and key_splits 3 at T = 72 (timed at prompt 8192
# only). (1) DDTree-64 at prompt 4096 (cache 6784), the default against Triton at T = 72
# (DDTREE_MGPU_ATTENTION=256-1032: a set range turns the long-cache T = 72 off), ABAB;
# (2) near the threshold's short end: prompt 2048 with 64 rounds (max new 2568 -> cache 6784, the
# prefix 2048-2400), DDTree-256 default against the old config (264:64x3w2so) and DDTree-64
# default against Triton.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s28a.sh
source bench/gpu_step.sh
record_commit
TRI=DDTREE_MGPU_ATTENTION=256-1032
OLD=DDTREE_MGPU_CONFIG=264:64x3w2so
export SECS=55 ROUNDS=32 PROMPT=4096
ddtree_rounds p4096_d64_new1 ddtree 64
ddtree_rounds p4096_d64_tri1 ddtree 64 $TRI
ddtree_rounds p4096_d64_new2 ddtree 64
ddtree_rounds p4096_d64_tri2 ddtree 64 $TRI
export SECS=65 ROUNDS=64 PROMPT=2048
ddtree_rounds p2048_d256_new ddtree 256
ddtree_rounds p2048_d256_old ddtree 256 $OLD
ddtree_rounds p2048_d64_new ddtree 64
ddtree_rounds p2048_d64_tri ddtree 64 $TRI
finish s28a
