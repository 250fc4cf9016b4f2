#!/usr/bin/env bash
# Session 12, first call (~8 min): gpu_next_s12a.sh and s12b.sh cut to one call.
# (1) bench_tree: the exact tree's global pruning (ddtree._beam_bounds) off and on, B = 16-1024.
# (2) DDTree-64 / 256 rounds with today's defaults (global pruning, the reordered qk_norm_rope).
# (3) Profiles of DDTree-64 and DDTree-256 (32 rounds, one process): where the 256 round's
#     ~1 ms gap to its target goes, and qk_norm_rope's per-call time against s10a's 3.6 us.
# Usage (device tool): bash bench/sessions/gpu_s12_1.sh -> $OUT/s12_1.tar.xz
source bench/gpu_step.sh
record_commit
step tree 150 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --global-prune 0,1 \
  --out "$R/tree"
ddtree_rounds base ddtree 64,256
step prof 240 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64,ddtree:256 \
  --rounds 32 --out "$R/prof"
finish s12_1
