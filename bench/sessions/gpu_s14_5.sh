#!/usr/bin/env bash
# Session 14, call 5: the vocabulary top-k's second stage by the threshold kernel + a pairwise
# order (ddtree._second_stage_by_threshold) against lax.top_k, whole build by device time at B = 16 / 64.
# Usage (device tool): bash bench/sessions/gpu_s14_5.sh -> $OUT/s14_5.tar.xz
source bench/gpu_step.sh
record_commit
step tree 150 python3 -m bench.bench_tree --budgets 16,64 --count-max 8192 --stage2-max-k 0,64 --trace --out "$R/tree"
finish s14_5
