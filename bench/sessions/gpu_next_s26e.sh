#!/usr/bin/env bash
# Session 26 (~7 min): the Mosaic GPU attention's tail split (config tN, new): at T = 264
# (DDTree-256) the last row-block group of each kv head in a launch of its own, its keys split
# over N CTAs, so the first 16 groups run in one wave. (1) The kernel alone at T = 264 over
# prefixes 512 / 4096 / 8192 against the default; (2) DDTree-256 rounds at prompt 4096 and 512,
# interleaved, default against 264:64x4w2kst16.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s26e.sh
source bench/gpu_step.sh
record_commit
step alone264 120 python3 -m bench.bench_mgpu --ts 264,256 --prefixes 512,4096,8192 \
  --configs 64x3w2so,64x4w2ks,64x4w2kst16,64x4w2kst8,64x3w2sot8 --inner 8 --out "$R/alone264"
T=DDTREE_MGPU_CONFIG=264:64x4w2kst16,64x3w2so
export SECS=60 ROUNDS=32
PROMPT=4096 ddtree_rounds p4k_def ddtree 256
PROMPT=4096 ddtree_rounds p4k_tail ddtree 256 $T
PROMPT=512 ddtree_rounds p512_def ddtree 256
PROMPT=512 ddtree_rounds p512_tail ddtree 256 $T
PROMPT=4096 ddtree_rounds p4k_def2 ddtree 256
PROMPT=4096 ddtree_rounds p4k_tail2 ddtree 256 $T
finish s26e
