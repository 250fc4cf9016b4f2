#!/usr/bin/env bash
# Prepared in session 15 for the next session (~8 min): (1) the select second stage's radix
# (select_top is latency-bound, ~0.6 us a radix round: 4 bits a round halves the rounds) at
# B = 128 / 256 / 1024 by device time; (2) DDTree-1024 rounds with the select second stage (the
# default since session 15) against lax.top_k's sort, interleaved (s15e's 75 s steps were too
# short for the 1024 compile).
# Usage (device tool): bash bench/gpu_next_s16a.sh -> $OUT/s16a.tar.xz
source bench/gpu_step.sh
record_commit
step radix 200 python3 -m bench.bench_tree --budgets 128,256,1024 --count-max 8192 --select-radix 2,4 \
  --repeats 3 --trace --out "$R/radix"
ROUNDS=16 SECS=150 ddtree_rounds sel_a ddtree 1024
ROUNDS=16 SECS=150 ddtree_rounds topk_a ddtree 1024 DDTREE_VOCAB_STAGE2_SELECT=0
finish s16a
