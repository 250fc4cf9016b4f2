#!/usr/bin/env bash
# Session 28, third call (~7 min). s28b: at prompt 512 over a 9344-position cache DDTree-64 on
# LONG_CACHE_CONFIGS[72] (64x4w2kc3) ran 6.048 ms a call against Triton's 6.230, so the key
# split may pay over short prefixes too (s21b's tie was c2). (1) Alone at T = 72 over 512 / 1024
# / 2048-token prefixes: Triton, 64x4w2k, c2, c3; alone at T = 16 (the drafter's block) over
# 512 / 4096: Triton against c4 / c8 / c16 (8 CTAs without a split). (2) DDTree-64 at prompt
# 512 (cache 3200), ABAB: the default (Triton) against c3 forced; (3) prompt 2048 (cache 4736),
# AB.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s28c.sh
source bench/gpu_step.sh
record_commit
step alone72 70 python3 -m bench.bench_mgpu --ts 72 --prefixes 512,1024,2048 \
  --configs triton,64x4w2k,64x4w2kc2,64x4w2kc3 --inner 8 --out "$R/alone72"
step alone16 60 python3 -m bench.bench_mgpu --ts 16 --prefixes 512,4096 \
  --configs triton,64x4w2kc4,64x4w2kc8,64x4w2kc16 --inner 8 --out "$R/alone16"
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=50 ROUNDS=32 PROMPT=512
ddtree_rounds p512_d64_tri1 ddtree 64
ddtree_rounds p512_d64_c3a ddtree 64 $C3
ddtree_rounds p512_d64_tri2 ddtree 64
ddtree_rounds p512_d64_c3b ddtree 64 $C3
export SECS=55 PROMPT=2048
ddtree_rounds p2048_d64_tri ddtree 64
ddtree_rounds p2048_d64_c3 ddtree 64 $C3
finish s28c
