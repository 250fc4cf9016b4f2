#!/usr/bin/env bash
# Prepared in session 27 for the next session (~8 min; one call). The long-cache configs' worst
# case: a short prompt with a long output. Prompt 512 with 128 rounds (max new 5128 -> cache
# 9344, the prefix 512-1200): DDTree-256 default against the old config, DDTree-64 default
# against Triton. Then DDTree-64 at batch 2, prompt 4096, where the long-cache T = 72 config's
# 240 CTAs do not fit one wave (Triton runs): Triton against the kernel without key splits
# (64x4w2k: 80 CTAs), a candidate batch-2 entry for LONG_CACHE_CONFIGS[72].
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s28b.sh
source bench/gpu_step.sh
record_commit
TRI=DDTREE_MGPU_ATTENTION=256-1032
OLD=DDTREE_MGPU_CONFIG=264:64x3w2so
export SECS=80 ROUNDS=128 PROMPT=512
ddtree_rounds p512l_d256_new ddtree 256
ddtree_rounds p512l_d256_old ddtree 256 $OLD
ddtree_rounds p512l_d64_new ddtree 64
ddtree_rounds p512l_d64_tri ddtree 64 $TRI
export SECS=60 ROUNDS=32 PROMPT=4096
ddtree_rounds b2p4096_d64_tri ddtree 64 --batch 2
ddtree_rounds b2p4096_d64_k ddtree 64 DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2k,64x3w2so --batch 2
finish s28b
