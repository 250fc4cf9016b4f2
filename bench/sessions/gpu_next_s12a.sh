#!/usr/bin/env bash
# Prepared in session 11 for the next session's first call (~7.5 min; the profiles are
# gpu_next_s12b.sh). (1) bench_tree: the exact tree's global pruning (ddtree._beam_bounds,
# built in session 11, never timed on a GPU) off and on, B = 16-1024, whole build.
# (2) DDTree-64 / 256 rounds, DDTREE_GLOBAL_PRUNE=0 vs the default (on), interleaved twice.
# Usage (device tool): bash bench/sessions/gpu_next_s12a.sh -> $OUT/s12a.tar.xz
source bench/gpu_step.sh
record_commit
step tree 150 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --global-prune 0,1 \
  --out "$R/tree"
ddtree_rounds off1 ddtree 64,256 DDTREE_GLOBAL_PRUNE=0
ddtree_rounds on1 ddtree 64,256
ddtree_rounds off2 ddtree 64,256 DDTREE_GLOBAL_PRUNE=0
ddtree_rounds on2 ddtree 64,256
finish s12a
