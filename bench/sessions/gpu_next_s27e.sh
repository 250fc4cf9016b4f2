#!/usr/bin/env bash
# Session 27, fifth call (~4 min, the session's last device seconds): DDTree-64 over long
# prefixes on the Mosaic GPU kernel with key_splits (T = 72 stays on Triton by default; s22a at
# prompt 4096: 64x4w2kc2 -0.06 ms a call, one pair). Alone at T = 72 over 4096 / 8192-token
# prefixes (Triton, c2, c3), then DDTree-64 rounds at prompt 8192: Triton against c2 and c3.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=230 bash bench/sessions/gpu_next_s27e.sh
source bench/gpu_step.sh
record_commit
step alone72 50 python3 -m bench.bench_mgpu --ts 72 --prefixes 4096,8192 \
  --configs triton,64x4w2kc2,64x4w2kc3 --inner 8 --out "$R/alone72"
export SECS=55 ROUNDS=32 PROMPT=8192
ddtree_rounds p8192_tri ddtree 64
ddtree_rounds p8192_c2 ddtree 64 DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc2,64x3w2so
ddtree_rounds p8192_c3 ddtree 64 DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so
finish s27e
