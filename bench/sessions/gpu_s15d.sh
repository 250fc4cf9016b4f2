#!/usr/bin/env bash
# Session 15, call d (~8 min): (1) check_tree at B = 1024, where s15c's "zeros" log-probs gave a
# different tree: with the defaults (select second stage on, prefilter off), with the old second
# stage (lax.top_k), and with the prefilter on, to find which path differs; (2) session 14's
# prepared gpu_next_s15b.sh: the ancestor mask square vs chain at 17 / 65 slots and decode tiles at
# 4k / 8k by device span.
# Usage (device tool): bash bench/sessions/gpu_s15d.sh -> $OUT/s15d.tar.xz
source bench/gpu_step.sh
record_commit
step check_default 70 python3 -m bench.check_tree --budgets 1024 --no-beam-kernel
step check_oldstage2 70 env DDTREE_VOCAB_STAGE2_SELECT=0 python3 -m bench.check_tree --budgets 1024 --no-beam-kernel
step check_prefilter 70 env DDTREE_SELECT_TOP_FROM=2048 python3 -m bench.check_tree --budgets 1024 --no-beam-kernel
step anc 100 python3 -m bench.bench_tree --budgets 16,64 --count-max 8192 --ancestor-impl square,chain --trace --out "$R/anc"
step dectiles 200 python3 bench/bench_kernels.py --ts 1 --tile-prefix 4096 --split-prefixes 8192 \
  --t-splits 1=32 --no-table --no-correctness --trace --budget-s 180 --out "$R/dectiles"
finish s15d
