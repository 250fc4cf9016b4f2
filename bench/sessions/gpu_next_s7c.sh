#!/usr/bin/env bash
# Session 7, second call (~8 min): gpu_next_s7b.sh without its matmul-config sweep (s7a: the
# kernel's table did not move the DDTree-64 round, 6.772 vs 6.773 ms) and with, in its place, XLA
# choosing cuBLAS for every dot (--xla_gpu_enable_triton_gemm=false: at 65 rows o and down run as
# XLA's own Triton gemm fusions at 1.8-2.7 TB/s, qkv and gate_up as cuBLAS nvjet at 2.7-3.9).
# Usage (device tool): bash bench/sessions/gpu_next_s7c.sh -> $OUT/s7c.tar.xz
source bench/gpu_step.sh
step attn512 100 python3 bench/bench_kernels.py --out "$R/attn512" --budget-s 95 --ts 257,65 --tile-prefix 512 \
  --split-prefixes 512 --t-splits 257=1,2 --t-splits 65=1,2 --no-table --no-correctness --cold-mb 160
step gemm_int8 60 python3 -m bench.bench_gemm --out "$R/gemm_int8" --budget-s 55 --rows 16 \
  --shapes o_int8,drafter_kv_int8,gate_up_int8,down_int8,lm_head_int8 --variants xla,pallas
step cublas 100 env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false python3 -m bench.bench_round --model qwen3-8b \
  --prompt-len 512 --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --verify-loop --out "$R/cublas"
step stages_more 180 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
  --budgets 16,1024 --rounds 32 --repeats 3 --stage-loop --out "$R/stages_more"
step int8 90 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-loop --drafter-quant int8 --out "$R/int8"
finish s7c
