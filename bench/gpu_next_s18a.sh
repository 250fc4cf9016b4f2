#!/usr/bin/env bash
# Prepared in session 17 for the next session (~8 min; give each round step >= 100 s: a cold
# start's first weight load ate s17d's 50 s steps). (1) DDTree-256 rounds with rank_select from
# 1000 entries (the shipped default since session 17, timed in builds only) against without,
# interleaved; (2) the build at B = 128 / 256 / 512 with the kernel from 1 / 1000 / off (the
# threshold: B = 128's final and B = 512 are untimed); (3) beam_select with session 17's
# accumulator (untimed; s17b's version took 24 / 40 / 85 us at B = 16 / 32 / 64) against XLA's
# loop; (4) a DDTree-64 profile of this tree (session 17's tie rule: where the tree stage's ~0.13 ms
# went).
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s18a.sh
source bench/gpu_step.sh
record_commit
SECS=100 ddtree_rounds r256_a ddtree 256
SECS=100 ddtree_rounds x256_a ddtree 256 DDTREE_RANK_KERNEL_FROM=0
SECS=100 ddtree_rounds r256_b ddtree 256
SECS=100 ddtree_rounds x256_b ddtree 256 DDTREE_RANK_KERNEL_FROM=0
step tree 120 python3 -m bench.bench_tree --budgets 128,256,512 --count-max 8192 --rank-kernel-from 0,1,1000 \
  --repeats 3 --trace --out "$R/tree"
step beam 80 python3 -m bench.bench_tree --budgets 16,32,64 --count-max 8192 --beam-kernel-max 0,1000 \
  --repeats 3 --trace --out "$R/beam"
step prof64 110 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 \
  --out "$R/prof64"
finish s18a
