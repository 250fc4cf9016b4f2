#!/usr/bin/env bash
# Prepared in session 4 (not yet run), issue 3: (1) where DDTree-64's and DDTree-1024's fused
# rounds go at the current commit, per kernel kind (session 2's profile predates the norm and
# attention kernels); (2) session 2's profile put the 65-row verify GEMMs ~0.5 ms above 16-row ones
# (cuBLAS 128x72 tiles): does XLA's exhaustive GEMM tiling search find better tiles? Compare with
# session 4's DDTree-64 7.32 ms steady. Its compile may be slow: it runs last.
# Usage (device tool): bash bench/gpu_next_s5c.sh -> $OUT/s5c.tar.xz   (~9.5 min)
source bench/gpu_step.sh
step profile 260 python3 -m bench.profile_round --model qwen3-8b --methods ar,ddtree:64,ddtree:1024 --rounds 8 \
  --out "$R/profile"
step exhaustive 270 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
  --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --xla-option xla_gpu_exhaustive_tiling_search=true \
  --out "$R/exhaustive"
finish s5c
