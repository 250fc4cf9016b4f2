#!/usr/bin/env bash
# Prepared in session 7 for the next session's first call (~8.5 min). Session 7's profile (bench/
# RESULTS.md, "Session 7") put the DDTree-64 round's largest removable terms at: o and down as
# XLA Triton split-K GEMMs + a reduce each (1.9-3.0 TB/s, ~0.6 ms a round over gate_up's 3.9
# TB/s), the tree attention (0.50 ms at 64, 1.15 at 256: 7-10x its floor), and the int8 drafter's
# products reading int8 at only ~2 TB/s (saves 0.11 of the draft's 0.91 ms; at 3.5 TB/s ~0.4).
# (1) int8 product configs at 16 rows with more bytes in flight (block_k 256/512, wider columns)
#     and with swapped operands (swap_ab), ranked by device time, winners -> $R/matmul_int8.json;
#     the bf16 products at 65 rows with swap_ab -> $R/matmul_swap.json (try it end to end in s8b
#     or later only if it beats XLA's dot by a margin);
# (2) that table end to end with the int8 drafter (DDTree-64) against the int8 row without it;
# (0) first, the products alone without XLA's split-K autotuning (XLA only; o and down at 65
#     rows then take other tilings or cuBLAS); the rounds under that flag: gpu_next_s8c.sh.
# The attention A/B that s7e left open and a profile of the matmul table's round: gpu_next_s8b.sh.
# Usage (device tool): bash bench/sessions/gpu_next_s8a.sh -> $OUT/s8a.tar.xz
source bench/gpu_step.sh
step gemm_no_splitk 70 env XLA_FLAGS=--xla_gpu_enable_split_k_autotuning=false python3 -m bench.bench_gemm \
  --out "$R/gemm_no_splitk" --budget-s 65 --rows 65,16 --shapes qkv,o,gate_up,down,o_int8,gate_up_int8,down_int8 \
  --variants xla
step gemm_int8 100 python3 -m bench.bench_gemm --out "$R/gemm_int8" --budget-s 95 --rows 16 \
  --shapes gate_up_int8,down_int8,o_int8,drafter_kv_int8 --variants xla,pallas --sweep-rows 16 \
  --sweep pallas:128x256x4x4x1,pallas:64x512x4x3x1,pallas:128x512x8x3x1,pallas:64x256x4x4x1,pallas:64x128x4x4x1x1x1,pallas:128x256x4x4x1x1x1,pallas:128x128x4x4x1x1x1 \
  --write-table "$R/matmul_int8.json"
# swap_ab (session 7: w_tile^T @ x_tile^T, the weight tile on the MMA's 64-row side) at 65 rows
step gemm_swap 100 python3 -m bench.bench_gemm --out "$R/gemm_swap" --budget-s 95 --rows 65 \
  --shapes qkv,o,gate_up,down --variants xla,pallas --sweep-rows 65 \
  --sweep pallas:64x128x4x4x2x1x1,pallas:128x128x4x4x1x1x1,pallas:128x64x4x4x1x1x1,pallas:128x128x8x3x1x1x1,pallas:64x128x4x4x1x1x1 \
  --write-table "$R/matmul_swap.json"
# the fused prologues (rmsnorm in qkv, swiglu in down: 0.4-1.0 TB/s in session 6) with swap_ab
step gemm_prologue_swap 70 python3 -m bench.bench_gemm --out "$R/gemm_prologue_swap" --budget-s 65 --rows 16 \
  --shapes qkv_norm,down_swiglu --variants xla,pallas --sweep-rows 16 \
  --sweep pallas:64x128x4x4x1x1x1,pallas:128x128x4x4x1x1x1
step int8_table 130 env DDTREE_MATMUL_TABLE="$R/matmul_int8.json" python3 -m bench.bench_round --model qwen3-8b \
  --prompt-len 512 --methods ddtree --budgets 64 --rounds 32 --repeats 3 --stage-loop --drafter-quant int8 \
  --matmul-impl auto --out "$R/int8_table"
finish s8a
