#!/usr/bin/env bash
# Prepared in session 26 for the next session (~8 min; one call). Session 26's tail split (config
# tN: at T = 264 the last row-block group of each kv head in a launch of its own, its keys split
# over N CTAs) ran DDTree-256 0.43-0.48 ms a call faster at a 4096-token prompt and 0.25 slower
# at 512 (s26e), with the launches joined by an in-place update that XLA rejected outside the
# round; dd14e4a joins them by a concatenation, untimed. (1) The kernel alone at T = 264 with the
# concatenation over prefixes 512 / 2048 / 4096 / 8192 (N = 8, 16, 32; two blocks a CTA with
# N = 8); (2) DDTree-256 rounds at prompts 4096, 2048 and 512, default against 264:64x4w2kst16,
# interleaved: where does it start to pay (the cache-size rule to make it a default).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s27a.sh
source bench/gpu_step.sh
record_commit
step alone264 120 python3 -m bench.bench_mgpu --ts 264 --prefixes 512,2048,4096,8192 \
  --configs 64x3w2so,64x4w2kst8,64x4w2kst16,64x4w2kst32,64x3w2sot8 --inner 8 --out "$R/alone264"
T=DDTREE_MGPU_CONFIG=264:64x4w2kst16,64x3w2so
export SECS=55 ROUNDS=32
for p in 4096 2048 512; do
  PROMPT=$p ddtree_rounds p${p}_def ddtree 256
  PROMPT=$p ddtree_rounds p${p}_tail ddtree 256 $T
done
finish s27a
