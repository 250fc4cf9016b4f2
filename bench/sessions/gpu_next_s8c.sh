#!/usr/bin/env bash
# Prepared in session 7 (~6.5 min; after gpu_next_s8a/b.sh). (1) The rounds without XLA's split-K
# autotuning (s8a's gemm_no_splitk shows the products alone). (2) The tree build's selection
# barrier alone (bench_tree, both settings); in the round: gpu_next_s8d.sh.
# Usage (device tool): bash bench/sessions/gpu_next_s8c.sh -> $OUT/s8c.tar.xz
source bench/gpu_step.sh
step no_splitk 220 env XLA_FLAGS=--xla_gpu_enable_split_k_autotuning=false python3 -m bench.bench_round \
  --model qwen3-8b --prompt-len 512 --methods ar,ddtree --budgets 64,256 --rounds 32 --repeats 3 --verify-loop \
  --out "$R/no_splitk"
# the tree build with each selection's inputs materialized (ddtree.SELECT_BARRIER, session 7:
# the HLO shows XLA recomputing every depth's gather chain inside its pairwise comparison and
# writing that [P, P] comparison out)
step tree_barrier 150 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --select-barrier 0,1 \
  --out "$R/tree_barrier"
finish s8c
