#!/usr/bin/env bash
# Prepared in session 16 for the next session (~8 min): the drafter's o and down products at 16
# rows inside the split-K-1 round executables (DDTree-32..64). There XLA runs them as cuBLAS
# split-K plus a ~2 us reduce kernel (s16c profile: o 11.0 + 2.0, down 26.3 + ~2 us a layer); the
# kernel alone took 11.4 / 27.4 us in session 7. (1) the products alone, XLA with and without the
# option against kernel configs, the winners over XLA-with-the-option written into a copy of the
# shipped table (`--against`: entries with xla_options); (2) DDTree-64 rounds with that table
# against the shipped one, interleaved (keep the entries only if the rounds say so); (3) the int8
# drafter's new product shapes (its table entry was for session 15's per-layer k/v).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s17a.sh
source bench/gpu_step.sh
record_commit
F=xla_gpu_experimental_force_split_k=1
cp pallas_kernels/matmul_configs.json "$R/cand.json"
step gemm16 150 python3 -m bench.bench_gemm --rows 16 --shapes o,down --variants \
  xla,xla:$F,pallas,pallas:64x128x4x4x2x1x0,pallas:64x128x4x4x1x1x0,pallas:128x128x4x4x1x1x0,pallas:64x128x4x4x4x1x0 \
  --against "xla:$F" --write-table "$R/cand.json" --out "$R/gemm16"
SECS=100 ddtree_rounds cand_a ddtree 64 DDTREE_MATMUL_TABLE="$R/cand.json"
SECS=100 ddtree_rounds ship_a ddtree 64
SECS=100 ddtree_rounds cand_b ddtree 64 DDTREE_MATMUL_TABLE="$R/cand.json"
SECS=100 ddtree_rounds ship_b ddtree 64
step gemm16_int8 90 python3 -m bench.bench_gemm --rows 16 --shapes qkv_int8,ctx_kv_int8 --variants \
  xla,xla:$F,pallas,pallas:64x128x4x4x2x1x0,pallas:64x128x4x4x1x1x0 --out "$R/gemm16_int8"
finish s17a
