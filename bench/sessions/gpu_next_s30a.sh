#!/usr/bin/env bash
# Prepared in session 29 for the next session (~8 min; one call). (1) The key shares' merge in one
# Pallas Triton kernel (config suffix m, pallas_kernels/split_merge.py; built in session 29 and
# tested in interpret mode only): XLA's merge is two fusions on the H200 (s29d alone at T = 72:
# 1.2 + 1.6 us a layer, plus the gap). Alone at T = 72 (c3 against c3m) and at T = 264 (the
# tail split, 8 shares), then DDTree-64 rounds at prompt 512, ABAB, default against c3m. If c3m
# wins, make it ONE_WAVE_CONFIGS[72]'s (and LONG_CACHE_CONFIGS' tN entries') default.
# (2) DDTree-64's round by kernel on the defaults (graph mode; session 23's prof64 ran Triton's
# attention), to rank what is left beyond the verify's products.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s30a.sh
source bench/gpu_step.sh
record_commit
step alone 110 python3 -m bench.bench_mgpu --inner 8 --ts 72 --prefixes 512,4096 \
  --configs 64x4w2kc3,64x4w2kc3m --out "$R/alone"
step alone264 70 python3 -m bench.bench_mgpu --inner 8 --ts 264 --prefixes 4096 \
  --configs 64x4w2kst8,64x4w2kst8m --out "$R/alone264"
M="DDTREE_MGPU_CONFIG=72:64x4w2kc3m,64x3w2so"
export SECS=65 ROUNDS=32 PROMPT=512
SECS=90 ddtree_rounds d64_default1 ddtree 64
ddtree_rounds d64_m1 ddtree 64 $M
ddtree_rounds d64_default2 ddtree 64
ddtree_rounds d64_m2 ddtree 64 $M
step prof64 110 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 \
  --rounds 16 --graphs --out "$R/prof64"
finish s30a
