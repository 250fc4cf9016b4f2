#!/usr/bin/env bash
# Session 15, call e (~6 min): (1) check_tree at B = 1024 with the second stage's lax.top_k and
# fallback on total-order int keys (s15d: "zeros" differed with every setting); (2) DDTree-64
# rounds, the ancestor mask square (the default below 257 slots) vs chain, interleaved (s15d's
# build alone: chain 0.157 vs 0.167 ms, span 180 vs 277 us; session 10's rounds had square ahead);
# (3) DDTree-1024 rounds with the select second stage vs lax.top_k's.
# Usage (device tool): bash bench/sessions/gpu_s15e.sh -> $OUT/s15e.tar.xz
source bench/gpu_step.sh
record_commit
step check 70 python3 -m bench.check_tree --budgets 1024 --no-beam-kernel
SECS=60 ddtree_rounds sq_a ddtree 64
SECS=60 ddtree_rounds chain_a ddtree 64 DDTREE_ANCESTOR_IMPL=chain
SECS=60 ddtree_rounds sq_b ddtree 64
SECS=60 ddtree_rounds chain_b ddtree 64 DDTREE_ANCESTOR_IMPL=chain
ROUNDS=16 SECS=75 ddtree_rounds sel_a ddtree 1024
ROUNDS=16 SECS=75 ddtree_rounds topk_a ddtree 1024 DDTREE_VOCAB_STAGE2_SELECT=0
finish s15e
