#!/usr/bin/env bash
# Session 26 (~4 min): the Mosaic GPU skinny matmul (pallas_kernels/matmul_mgpu.py: TMA ring,
# warp-specialized, wgmma) against XLA's dot at the verify shapes of DDTree-64 (65 rows; 72 =
# padded) and DDTree-16 / DFlash (17), cold weights (bench_gemm's chains), device time.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s26d.sh
source bench/gpu_step.sh
record_commit
F=xla_gpu_experimental_force_split_k=1
V=xla,xla:$F,mgpu:64x2x64x4x2,mgpu:64x2x64x4x4,mgpu:64x1x64x6x2,mgpu:64x1x64x6x1,mgpu:64x2x64x5x1,mgpu:64x1x128x3x2,mgpu:128x1x64x4x1
step gemm_mgpu 420 python3 -m bench.bench_gemm --rows 65,72,17 --shapes o,qkv,down,gate_up --variants "$V" \
  --trace all --reps 5 --budget-s 400 --out "$R/gemm_mgpu"
finish s26d
