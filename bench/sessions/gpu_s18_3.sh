#!/usr/bin/env bash
# Session 18, call 3 (~9 min): the vocabulary top-k's pruned first stage (chunk_top_k
# impl="pruned": every chunk keeps only its entries >= the K-th largest chunk maximum; the radix
# select only in a chunk with more than K of them) against the threshold kernel (the default).
# (1) check_tree at B = 16 / 64 with it (DDTREE_VOCAB_STAGE1=pruned: the settings row);
# (2) the build by device time at B = 16 / 32 / 64 / 128 with each; (3) DDTree-16 / 64 rounds with
# each, interleaved.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s18_3.sh
source bench/gpu_step.sh
record_commit
step check 70 env DDTREE_VOCAB_STAGE1=pruned python3 -m bench.check_tree --budgets 16,64 --no-beam-kernel \
  --no-rank-kernel
for s1 in pruned threshold; do
  step "tree_$s1" 55 python3 -m bench.bench_tree --budgets 16,32,64,128 --count-max 8192 --stage1 $s1 \
    --repeats 3 --trace --out "$R/tree_$s1"
done
SECS=95 ddtree_rounds pruned_a ddtree 16,64 DDTREE_VOCAB_STAGE1=pruned
SECS=95 ddtree_rounds thresh_a ddtree 16,64
SECS=95 ddtree_rounds pruned_b ddtree 16,64 DDTREE_VOCAB_STAGE1=pruned
SECS=95 ddtree_rounds thresh_b ddtree 16,64
finish s183
