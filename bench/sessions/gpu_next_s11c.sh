#!/usr/bin/env bash
# Session 11: split-K partials for the 65-row products (qkv, o, down). The s10a profile has them
# at 16.0 / 11.8 / 28.0 us a layer (3.1 / 2.8 / 3.6 TB/s) against gate_up's 4.1 TB/s; o runs
# cuBLAS tiles that give 64 programs. bench_gemm: XLA's dot as the round compiles it (split-K 1),
# matmul_parts' batched dot in 2 / 4 / 8 parts (its sum by an XLA fusion here; the round would
# sum inside the norm kernel), and the skinny kernel's split-K configs (kernel us = alone).
# Usage (device tool): bash bench/sessions/gpu_next_s11c.sh -> $OUT/s11c.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
F=xla_gpu_experimental_force_split_k=1
step gemm 300 python3 -m bench.bench_gemm --rows 65 --shapes qkv,o,down \
  --variants xla:$F,split:2:$F,split:4:$F,split:8:$F,pallas:64x128x4x4x2x1x0,pallas:64x128x4x4x4x1x0,pallas:32x128x4x4x2x1x0,pallas:32x128x4x4x1x1x0,pallas:64x256x4x3x2x1x0,pallas:128x128x8x3x4x1x0 \
  --out "$R/gemm"
finish s11c
