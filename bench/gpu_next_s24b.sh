#!/usr/bin/env bash
# Session 24, call b (~6 min): inside the Mosaic GPU verify-attention kernel.
# (1) One wave or two: at T = 256 a row block a CTA (split keys, 64x4w2ks) is 16 blocks x 8 kv heads
#     = 128 CTAs on 132 SMs; at T = 264 (DDTree-256's padded verify) 17 x 8 = 136, a second wave.
#     How fast would one wave be against the default 64x3w2s (72 CTAs, two row blocks each)?
# (2) bench.profile_mgpu (new): the kernel's in-kernel profile at T = 72 and 264, cycles a warpgroup
#     spends waiting for K / V, in the products, in the softmax, merging and storing.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s24b.sh
source bench/gpu_step.sh
record_commit
step waves 150 python3 -m bench.bench_mgpu --ts 248,256,264 --prefixes 512 \
  --configs 64x3w2s,64x4w2ks,64x4w2k,64x2w2ks --inner 8 --out "$R/waves"
step prof 150 python3 -m bench.profile_mgpu --ts 72,256,264 --prefixes 512 \
  --configs 64x3w2s,64x4w2ks,64x3w2 --out "$R/prof"
step prof4k 90 python3 -m bench.profile_mgpu --ts 264 --prefixes 4096 --configs 64x3w2s --out "$R/prof4k"
finish s24b
