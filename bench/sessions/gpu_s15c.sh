#!/usr/bin/env bash
# Session 15, call c (~9 min): the select_top prefilter (ddtree.SELECT_TOP_FROM) and the select
# second stage (VOCAB_TOPK stage2_select) at B = 128 / 256 / 1024: (1) the same tree as XLA + a
# sort on the device; (2) the build alone by device time, each on / off; (3) DDTree-256 rounds
# with both on (the new default) interleaved with both off.
# Usage (device tool): bash bench/sessions/gpu_s15c.sh -> $OUT/s15c.tar.xz
source bench/gpu_step.sh
record_commit
step check_tree 170 python3 -m bench.check_tree --budgets 128,256,1024 --no-beam-kernel
step tree 260 python3 -m bench.bench_tree --budgets 128,256,1024 --count-max 8192 --select-top-from 0,1024,2048 \
  --stage2-select 0,1 --repeats 3 --trace --out "$R/tree"
SECS=70 ddtree_rounds new_a ddtree 256
SECS=70 ddtree_rounds old_a ddtree 256 DDTREE_SELECT_TOP_FROM=0 DDTREE_VOCAB_STAGE2_SELECT=0
SECS=70 ddtree_rounds new_b ddtree 256
finish s15c
