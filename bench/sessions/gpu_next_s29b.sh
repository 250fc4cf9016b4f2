#!/usr/bin/env bash
# Session 29, second call (~8 min). s29a: at batch 2, prompt 4096, DDTree-64 on 64x4w2kc3 forced
# (240 CTAs, two waves) ran 8.190 / 8.196 ms a call against Triton's 8.313 / 8.383 (ABAB). Before a
# batch-2 long-cache entry for T = 72: (1) T = 72 alone at batch 2 (bench_mgpu --batch 2), the
# two-wave c3 against configs of one warpgroup and two stages (~96 KB of shared memory: two CTAs
# an SM, if registers allow: c3's 240 CTAs in one wave); (2) rounds at batch 2, Triton against
# c3, at prompt 8192 and at the worst case for a cache-size rule, prompt 512 over 128 rounds
# (cache 8960, the prefix 512-1200).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s29b.sh
source bench/gpu_step.sh
record_commit
step alone72b2 170 python3 -m bench.bench_mgpu --batch 2 --ts 72 --prefixes 512,4096 --inner 8 \
  --configs triton,64x4w2k,64x4w2kc3,64x2w1c3,64x2w2kc3,64x2w1c2 --out "$R/alone72b2"
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=75 ROUNDS=32 PROMPT=8192
ddtree_rounds b2p8192_tri ddtree 64 --batch 2
ddtree_rounds b2p8192_c3 ddtree 64 $C3 --batch 2
export SECS=75 ROUNDS=128 PROMPT=512
ddtree_rounds b2p512r128_tri ddtree 64 --batch 2
ddtree_rounds b2p512r128_c3 ddtree 64 $C3 --batch 2
finish s29b
