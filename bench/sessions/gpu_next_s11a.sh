#!/usr/bin/env bash
# Prepared in session 10 for the next session's first call (~5-7 min; the rounds are
# gpu_next_s11b.sh). The vocabulary top-k's threshold first stage (pallas_kernels.chunk_topk,
# impl "threshold", built in session 10, never run on a GPU): the max-extraction kernel it would
# replace is 0.105 ms of a DDTree-64 round (s10a profile), ~40x its read of the logits.
# (1) bench_tree: the first stage alone (128 chunks keeping 64, extraction p vs threshold t at
#     its default 2 radix bits and 4 warps, then radix bits 1 / 4 and 1 / 2 / 8 warps; 64 wider
#     chunks; 128 keeping K) and the whole build with each first stage, B = 16-1024. If another
#     option wins (1), its rounds need DDTREE_VOCAB_STAGE1=threshold:rBITSwWARPS.
# Usage (device tool): bash bench/sessions/gpu_next_s11a.sh -> $OUT/s11a.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step tree_default 300 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 \
  --variants 128x64p,128x64t,128x64tr1,128x64tr4,128x64tw1,128x64tw2,128x64tw8,128x64tr4w2,64x64t,128x0t \
  --out "$R/tree_default"
step tree_threshold 120 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --stage1 threshold \
  --out "$R/tree_threshold"
finish s11a
