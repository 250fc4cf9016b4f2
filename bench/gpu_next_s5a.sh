#!/usr/bin/env bash
# Prepared in session 4 (not yet run): issue 4's end-to-end before/after at prefix 8192 (AR and
# DDTree-64, Pallas vs XLA), which session 4 lost to the one-piece 8192-token prefill's compile
# (fixed by the chunked prefill, cef42ff); then the tree build (issue 3): other vocabulary top-k
# splits, the keep path's worst case (its exact fallback), and the Pallas first stage
# (pallas_kernels/chunk_topk.py, selectable, never timed yet) in the top-k alone and in the build.
# Usage (device tool): bash bench/gpu_next_s5a.sh -> $OUT/s5a.tar.xz   (~9.5 min)
source bench/gpu_step.sh
step round8k 400 python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --attn-impl pallas,xla \
  --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/round8k"
step tree 80 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 \
  --variants 128x0p,128x64p,256x16,256x16p,1024x8,1024x8p --out "$R/tree"
step tree_pallas 70 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --stage1 pallas \
  --out "$R/tree_pallas"
finish s5a
