#!/usr/bin/env bash
# Prepared in session 11 for the next session's first call (~7.5 min; the profiles are
# gpu_next_s12b.sh). (1) bench_tree: the exact tree's global pruning (ddtree._beam_bounds,
# built in session 11, never timed on a GPU) off and on, B = 16-1024, whole build.
# (2) DDTree-64 / 256 rounds, DDTREE_GLOBAL_PRUNE=0 vs the default (on), interleaved twice.
# Usage (device tool): bash bench/gpu_next_s12a.sh -> $OUT/s12a.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step tree 150 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --global-prune 0,1 \
  --out "$R/tree"
rnd() {  # rnd NAME [env...]
  local name=$1; shift
  step "$name" 100 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets 64,256 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd off1 DDTREE_GLOBAL_PRUNE=0
rnd on1 DDTREE_X=0
rnd off2 DDTREE_GLOBAL_PRUNE=0
rnd on2 DDTREE_X=0
finish s12a
