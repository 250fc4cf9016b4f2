#!/usr/bin/env bash
# Prepared in session 5 (which had no device time: the cut-off session 4 had spent it), not yet
# run. The kernels alone, no 8B model (~9.5 min; first of the three calls, the most important):
# (1) the skinny-matmul kernel (pallas_kernels/matmul.py; *_norm: the RMSNorm fused in,
#     down_swiglu: the MLP activation fused in) against XLA's dot on the 8B shapes at
#     65 / 16 / 1 rows with HBM-cold weights, a config sweep at 65 rows (the DDTree-64 verify) and
#     XLA's exhaustive tiling search beside it; the winners go to $R/matmul_configs.json (copy it
#     to pallas_kernels/matmul_configs.json, run tests/test_matmul_kernel.py, commit: then
#     impl="auto" takes the kernel where it won, which gpu_next_s6b.sh measures end to end);
# (2) the tree build (issue 3): other vocabulary top-k splits and the Pallas first stage
#     (pallas_kernels/chunk_topk.py, never timed), from session 4's gpu_next_s5a.sh;
# (3) the int8 drafter's matmuls at 16 rows (--drafter-quant int8: int8 weights, per-column
#     scales) beside the bf16 ones of step (1), into the same table;
# (4) the attention kernel's tiles at a 512-key prefix for T = 257 / 65 (the bench_round prompt:
#     default_config's T = 257 tiles were chosen at 16k, where 72 programs fill the GPU; at 512
#     keys a 128-row tile leaves ~half the SMs idle): a correctness pass, then the sweeps.
# Usage (device tool): bash bench/sessions/gpu_next_s6a.sh -> $OUT/s6a.tar.xz
source bench/gpu_step.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$R/gpu.txt"
SWEEP=pallas:32x128x4x4x1,pallas:64x128x4x4x1,pallas:64x128x4x4x2,pallas:128x128x4x4x1
SWEEP=$SWEEP,pallas:128x128x8x3x2,pallas:64x64x4x4x2x0,xla:xla_gpu_exhaustive_tiling_search=true
# the fused layers' products first (qkv_norm, o, gate_up_norm, down_swiglu: target.forward's fused
# form), then the unfused ones; the sweep on the fused ones and the LM head at 65 rows
step gemm 265 python3 -m bench.bench_gemm --out "$R/gemm" --budget-s 250 --rows 65,16,1 \
  --shapes qkv_norm,o,gate_up_norm,down_swiglu,lm_head,qkv,gate_up,down --variants xla,pallas \
  --sweep "$SWEEP" --sweep-rows 65 --sweep-shapes qkv_norm,o,gate_up_norm,down_swiglu,lm_head \
  --write-table "$R/matmul_configs.json"
step tree 80 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 \
  --variants 128x0p,128x64p,256x16,256x16p,1024x8,1024x8p --out "$R/tree"
step tree_pallas 70 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --stage1 pallas \
  --out "$R/tree_pallas"
step gemm_int8 60 python3 -m bench.bench_gemm --out "$R/gemm_int8" --budget-s 55 --rows 16 \
  --shapes o_int8,drafter_kv_int8,gate_up_int8,down_swiglu_int8,lm_head_int8,drafter_kv --variants xla,pallas \
  --write-table "$R/matmul_configs.json"
step attn512 100 python3 bench/bench_kernels.py --out "$R/attn512" --budget-s 95 --ts 257,65 --tile-prefix 512 \
  --split-prefixes 512 --t-splits 257=1,2 --t-splits 65=1,2 --no-table --cold-mb 160
finish s6a
