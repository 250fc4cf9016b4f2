#!/usr/bin/env bash
# Prepared in session 29 for the next session (~6 min; one call). (1) DDTree-64's round by kernel on
# today's defaults (the T = 72 key split since session 28; session 23's prof64 ran Triton's
# attention): a graph-mode profile, to rank what is left beyond the verify's products (the
# split's two merge fusions, ~2.8 us a layer alone; q/k norm + RoPE 3.2 us; add + norm 2 x 2.3;
# SiLU x up 2.1). (2) Where the key split starts to pay at batch 2 (LONG_CACHE_MIN_SEQ = 5120 rules
# it): prompt 2048 (cache 4736), Triton against c3 forced, AB; s28f / s29a-b: +0.31 ms at cache
# 3200 (prompt 512), -0.13 to -0.37 from 6784.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s30a.sh
source bench/gpu_step.sh
record_commit
step prof64 120 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 \
  --rounds 16 --graphs --out "$R/prof64"
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=70 ROUNDS=32 PROMPT=2048
ddtree_rounds b2p2048_tri ddtree 64 --batch 2
ddtree_rounds b2p2048_c3 ddtree 64 $C3 --batch 2
finish s30a
