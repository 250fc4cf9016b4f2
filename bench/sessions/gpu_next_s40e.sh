#!/usr/bin/env bash
# Session 40, for the next session (~8 min, any Hopper card): issue 4's T = 72 verify over long
# prefixes. s40b's table had the round's Mosaic GPU kernel (64x4w2kc3m: 5 row blocks x 3 key
# shares x 8 kv heads = 120 CTAs on 132 SMs, 209 KB of shared memory: one CTA an SM) at 34 / 40 /
# 42 % of the bytes floor over 8k / 16k / 32k (29.5 / 50.7 / 95.9 us span, H100): each CTA near
# half an SM's MMA rate. Tried here at 32k / 8k / 4k, exactness against XLA first (bench_mgpu),
# then cold-cache device spans; the default first and last (the start's drift):
#   o: FlashAttention-3's overlap of the next QK product with the softmax (T = 264 has it; T = 72
#      never tried it with split keys); s: the empty new-key step skip; 2 stages (half the ring);
#   c4 / c13: 160 / 520 CTAs (1.2 / 3.9 waves) for the 120's 91 % of the SMs.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s40e.sh
source bench/gpu_step.sh
record_commit
step t72_long 540 python3 -m bench.bench_mgpu --ts 72 --prefixes 32768,8192,4096 \
  --configs 64x4w2kc3m,64x4w2kc3om,64x4w2ksc3m,64x2w2kc3m,64x4w2kc4m,64x4w2kc13m,64x4w2kc3m --out "$R/t72_long"
finish s40e
