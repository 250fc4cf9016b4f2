#!/usr/bin/env bash
# Prepared in session 4 (not yet run): issue 4's end-to-end before/after at prefix 8192 (AR and
# DDTree-64, Pallas vs XLA), which session 4 lost to the one-piece 8192-token prefill's compile
# (fixed by the chunked prefill, cef42ff), then on-device parity of the current kernels and the
# worst case of the tree build's top-k (its exact fallback).
# Usage (device tool): bash bench/gpu_next_s5a.sh -> $OUT/s5a.tar.xz   (~7 min)
source bench/gpu_step.sh
step round8k 420 python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --attn-impl pallas,xla \
  --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/round8k"
step check 70 python3 -m bench.check_gpu
step tree 90 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --variants 256x16,1024x8,512x16,64x0 \
  --out "$R"   # + the keep fallback's cost; other vocabulary top-k splits
finish s5a
