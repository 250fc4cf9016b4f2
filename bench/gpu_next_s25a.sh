#!/usr/bin/env bash
# Prepared in session 24 for the next session (~5 min; one call). Session 24's in-kernel profile
# (bench.profile_mgpu) put a key step of the Mosaic GPU verify attention at ~2000 cycles a
# warpgroup, of which softmax ~860 and each 64 x 64 x 128 product ~420; a CTA's fixed cost
# (q load, init, merge, store) at ~5000-6000 cycles. Key steps of 128 halve the steps and their
# per-step waits and reductions: does one step of 128 cost less than two of 64? Configs that fit
# in shared memory: 128x2w2ks (one row block a CTA, keys split), 128x2w1s; at T = 256 (one wave)
# and T = 264 (DDTree-256's padded verify), and their profiles.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s25a.sh
source bench/gpu_step.sh
record_commit
step k128 150 python3 -m bench.bench_mgpu --ts 72,256,264 --prefixes 512,4096 \
  --configs 64x3w2s,64x4w2ks,128x2w2ks,128x2w1s --inner 8 --out "$R/k128"
step prof 120 python3 -m bench.profile_mgpu --ts 256,264 --prefixes 512 \
  --configs 64x3w2s,128x2w2ks,128x2w1s --out "$R/prof"
finish s25a
