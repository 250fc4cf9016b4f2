#!/usr/bin/env bash
# Prepared in session 7 (~7.5 min; after gpu_next_s8a/b.sh). (1) The rounds without XLA's split-K
# autotuning (s8a's gemm_no_splitk shows the products alone). (2) The tree build's selection
# barrier, alone and in the round (compare round_barrier with session 7's stage-loop rows:
# DDTree-64 tree 0.34 ms, 1024 0.62 ms; and run the rows without it in the same call if close).
# Usage (device tool): bash bench/gpu_next_s8c.sh -> $OUT/s8c.tar.xz
source bench/gpu_step.sh
step no_splitk 150 env XLA_FLAGS=--xla_gpu_enable_split_k_autotuning=false python3 -m bench.bench_round \
  --model qwen3-8b --prompt-len 512 --methods ar,ddtree --budgets 64,256 --rounds 32 --repeats 3 --verify-loop \
  --out "$R/no_splitk"
# the tree build with each selection's inputs materialized (ddtree.SELECT_BARRIER, session 7:
# the HLO shows XLA recomputing every depth's gather chain inside its pairwise comparison and
# writing that [P, P] comparison out), then the DDTree-64 / 1024 rounds with it
step tree_barrier 120 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --select-barrier 0,1 \
  --out "$R/tree_barrier"
step round_barrier 150 env DDTREE_SELECT_BARRIER=1 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
  --methods ddtree --budgets 64,1024 --rounds 16 --repeats 3 --stage-loop --out "$R/round_barrier"
finish s8c
