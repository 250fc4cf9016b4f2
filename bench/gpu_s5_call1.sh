#!/usr/bin/env bash
# Session 5, device call 1 (~8 min): (1) the skinny-matmul kernel (pallas_kernels/matmul.py, new)
# against XLA's dot on the 8B shapes at 1 / 16 / 65 rows with HBM-cold weights, a config sweep at
# 65 rows (the DDTree-64 verify) and XLA's exhaustive tiling search beside it; (2) the tree build
# (issue 3): the vocabulary top-k's other splits and the Pallas first stage (pallas_kernels/
# chunk_topk.py, never timed yet), prepared in session 4 as gpu_next_s5a.sh's tree steps.
# Usage (device tool): bash bench/gpu_s5_call1.sh -> $OUT/s5c1.tar.xz
source bench/gpu_step.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$R/gpu.txt"
SWEEP=pallas:32x128x4x4x1,pallas:64x128x4x4x1,pallas:64x128x4x4x2,pallas:128x128x4x4x1,pallas:128x64x4x4x2
SWEEP=$SWEEP,pallas:64x64x4x6x2,pallas:64x256x4x3x1,pallas:128x128x8x3x2,pallas:256x64x8x4x1
SWEEP=$SWEEP,xla:xla_gpu_exhaustive_tiling_search=true
step gemm 300 python3 -m bench.bench_gemm --out "$R/gemm" --budget-s 285 --rows 65,16,1 \
  --shapes qkv,o,gate_up,down,lm_head --variants xla,pallas --sweep "$SWEEP" --sweep-rows 65
step tree 80 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 \
  --variants 128x0p,128x64p,256x16,256x16p,1024x8,1024x8p --out "$R/tree"
step tree_pallas 70 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --stage1 pallas \
  --out "$R/tree_pallas"
finish s5c1
