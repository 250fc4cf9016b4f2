#!/usr/bin/env bash
# Prepared in session 25 (~5 min; after s26a). Session 25 made the Mosaic GPU kernel's one-wave
# config at T = 256 (ONE_WAVE_CONFIGS: one row block a CTA, 128 CTAs at batch 1) depend on the
# grid fitting the SMs, from batch-1 measurements only: at batch 2 (256 CTAs) the rule gives the
# two-blocks-a-CTA default (64x3w2so, 128 CTAs). Check it: DDTree-255 at batch 2 with the rule's
# pick against the one-wave config forced, interleaved; and the kernel alone at T = 256 over the
# configs (bench_mgpu is batch 1).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s26b.sh
source bench/gpu_step.sh
record_commit
export SECS=70 ROUNDS=32
for i in 1 2; do
  ddtree_rounds b2_rule$i ddtree 255 --batch 2
  ddtree_rounds b2_onewave$i ddtree 255 DDTREE_MGPU_CONFIG=256:64x4w2ks,64x3w2so --batch 2
done
step alone256 60 python3 -m bench.bench_mgpu --ts 256 --prefixes 512,4096 --configs 64x4w2ks,64x3w2so --inner 8 \
  --out "$R/alone256"
finish s26b
