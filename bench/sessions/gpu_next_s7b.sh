#!/usr/bin/env bash
# Prepared in session 6, not yet run (~9 min; after gpu_next_s7a.sh). (1) The attention kernel's
# tiles at a 512-key prefix for T = 257 / 65 (session 6's try spent its step on the correctness
# pass: skipped here, session 6 passed it on this commit's kernel); (2) the int8 drafter's
# products ranked by device time; (3) the matmul kernel's configs at 65 rows by device time;
# (4) DDTree-16 / 1024 and the int8 drafter with the stage loop.
# Usage (device tool): bash bench/sessions/gpu_next_s7b.sh -> $OUT/s7b.tar.xz
source bench/gpu_step.sh
step attn512 100 python3 bench/bench_kernels.py --out "$R/attn512" --budget-s 95 --ts 257,65 --tile-prefix 512 \
  --split-prefixes 512 --t-splits 257=1,2 --t-splits 65=1,2 --no-table --no-correctness --cold-mb 160
step gemm_int8 60 python3 -m bench.bench_gemm --out "$R/gemm_int8" --budget-s 55 --rows 16 \
  --shapes o_int8,drafter_kv_int8,gate_up_int8,down_int8,lm_head_int8 --variants xla,pallas
# the kernel's configs at 65 rows by device time (the defaults leave qkv at 192 programs = 1.45
# waves of 132 SMs; s6a's sweep was ranked by the flawed wall figure)
step gemm_sweep 90 python3 -m bench.bench_gemm --out "$R/gemm_sweep" --budget-s 85 --rows 65 --shapes qkv,gate_up,down \
  --variants xla,pallas --sweep pallas:64x128x4x4x4,pallas:128x128x4x4x2,pallas:64x256x4x3x2,pallas:128x64x4x5x1,pallas:64x128x4x3x1
step stages_more 180 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
  --budgets 16,1024 --rounds 32 --repeats 3 --stage-loop --out "$R/stages_more"
step int8 90 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-loop --drafter-quant int8 --out "$R/int8"
finish s7b
