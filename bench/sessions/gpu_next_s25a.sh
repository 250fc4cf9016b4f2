#!/usr/bin/env bash
# Prepared in session 24 for the next session (~8 min; one call). Session 24's in-kernel profile
# (bench.profile_mgpu) put a key step of the Mosaic GPU verify attention at ~2000 cycles a
# warpgroup: softmax ~860, each 64 x 64 x 128 product ~420, one after the other; a CTA's fixed
# cost (q load, init, merge, store) ~5000-6000 cycles.
# (1) `o` (new, session 24: FlashAttention-3's intra-warpgroup overlap, the next QK product issued
#     before the softmax; exact in interpret mode, lowered for CUDA, never run on a GPU: check
#     rel_err first) and key steps of 128 (half the steps and their per-step waits), alone.
# (2) their profiles; (3) DDTree-256 rounds with 64x3w2so at T = 264 against the default,
#     interleaved.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s25a.sh
source bench/gpu_step.sh
record_commit
step alone 150 python3 -m bench.bench_mgpu --ts 72,256,264 --prefixes 512 \
  --configs 64x3w2s,64x3w2so,64x4w2ks,64x4w2kso,128x2w2ks,128x2w1s --inner 8 --out "$R/alone"
step alone4k 60 python3 -m bench.bench_mgpu --ts 264 --prefixes 4096 --configs 64x3w2s,64x3w2so --inner 8 \
  --out "$R/alone4k"
step prof 90 python3 -m bench.profile_mgpu --ts 256,264 --prefixes 512 \
  --configs 64x3w2s,64x3w2so,64x4w2kso,128x2w2ks --out "$R/prof"
export SECS=60 ROUNDS=32
for i in 1 2; do
  ddtree_rounds base$i ddtree 256
  ddtree_rounds over$i ddtree 256 DDTREE_MGPU_CONFIG=264:64x3w2so,64x3w2s
done
finish s25a
