#!/usr/bin/env bash
# Prepared in session 4 (not yet run), issue 3: (1) the 65-row verify GEMMs cost ~1 ms more than
# AR's 1-row ones (session 4: verify 5.34 vs 4.29 ms): does XLA's exhaustive GEMM tiling search
# find better tiles? Compare with session 4's AR 4.44 / DDTree-64 7.32 ms steady. (2) DDTree-1024's
# fused round (34.2 ms) cost more than its stages alone (27.7): trace it per kernel kind.
# Usage (device tool): bash bench/gpu_next_s5c.sh -> $OUT/s5c.tar.xz   (~9 min)
source bench/gpu_step.sh
step exhaustive 330 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,ddtree \
  --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --xla-option xla_gpu_exhaustive_tiling_search=true \
  --out "$R/exhaustive"
step profile1024 200 python3 -m bench.profile_round --model qwen3-8b --methods ddtree:1024 --rounds 8 --out "$R/profile1024"
finish s5c
