#!/usr/bin/env bash
# Prepared in session 9 (~5 min; after gpu_next_s10a.sh / s10b.sh). The small-budget selection
# variants in the round, against the default row of this call: every selection by XLA's sort
# (DDTREE_RANK_BY_COUNT_MAX=0: at B <= 64 each depth's P is < 300, where a sort may be one
# kernel) and the one-hot selection (DDTREE_SELECT_ONEHOT_MAX=20000: n * P <= 20000 covers
# every depth at B <= 64). Ship one only where s10a's bench_tree and this round agree.
# Usage (device tool): bash bench/sessions/gpu_next_s10c.sh -> $OUT/s10c.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
rnd() {  # rnd NAME [env...]
  local name=$1; shift
  step "$name" 100 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets 16,64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base DDTREE_X=0
rnd sort DDTREE_RANK_BY_COUNT_MAX=0
rnd onehot DDTREE_SELECT_ONEHOT_MAX=20000
finish s10c
