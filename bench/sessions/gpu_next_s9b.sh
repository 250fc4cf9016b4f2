#!/usr/bin/env bash
# Prepared in session 8 (~8 min; after gpu_next_s9a.sh). (1) The skinny matmul's swapped-operand
# form (MatmulConfig.swap_ab, built in session 7, never timed) at 65 rows against XLA's dot, which
# now runs without split-K at 33-65 rows (pass the option to bench_gemm's XLA variant through
# XLA_FLAGS, as the round gets it); (2) the int8 drafter's products at 16 rows with more bytes in
# flight and swap_ab -> a table, and that table end to end (DDTree-64 --drafter-quant int8);
# (3) the rank kernel's tiles (pallas_kernels.rank_count; session 8's default 32x128 lost to XLA).
# Commit a table only where its round beats the row without it in the same call.
# Usage (device tool): bash bench/sessions/gpu_next_s9b.sh -> $OUT/s9b.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step gemm_swap 110 env XLA_FLAGS=--xla_gpu_experimental_force_split_k=1 python3 -m bench.bench_gemm \
  --out "$R/gemm_swap" --budget-s 100 --rows 65 --shapes qkv,o,gate_up,down --variants xla,pallas --sweep-rows 65 \
  --sweep pallas:64x128x4x4x1x1x1,pallas:128x128x4x4x1x1x1,pallas:128x64x4x4x1x1x1,pallas:64x128x4x4x2x1x1 \
  --write-table "$R/matmul_swap.json"
step gemm_int8 100 python3 -m bench.bench_gemm --out "$R/gemm_int8" --budget-s 95 --rows 16 \
  --shapes gate_up_int8,down_int8,o_int8,drafter_kv_int8 --variants xla,pallas --sweep-rows 16 \
  --sweep pallas:128x256x4x4x1,pallas:64x512x4x3x1,pallas:128x512x8x3x1,pallas:64x128x4x4x1x1x1,pallas:128x256x4x4x1x1x1 \
  --write-table "$R/matmul_int8.json"
step int8_base 70 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-repeats 0 --drafter-quant int8 --out "$R/int8_base"
step int8_table 70 env DDTREE_MATMUL_TABLE="$R/matmul_int8.json" python3 -m bench.bench_round --model qwen3-8b \
  --prompt-len 512 --methods ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --drafter-quant int8 \
  --out "$R/int8_table"
step rank 100 python3 -m bench.bench_tree --budgets 256,1024 --count-max 8192 \
  --rank-impl xla,pallas,pallas:16x256x4,pallas:64x256x4,pallas:32x512x8,pallas:128x128x8 --out "$R/rank"
finish s9b
