#!/usr/bin/env bash
# Prepared in session 3, run in session 4: issue 3's round table at the current commit (AR, DFlash,
# DDTree 16/64/256/1024, steady state and stage breakdown), prompt 512. The 8B build alone takes
# ~90 s. Budgets 63 and 255 (T = 64, 256 verify rows, multiples of the GEMM/attention tiles) next to
# 64 and 256 (T = 65, 257): session 2 saw cuBLAS pick slow 128x72 tiles at 65 rows. Usage (device tool): bash bench/sessions/gpu_next_b.sh -> $OUT/next_b.tar.xz   (~9 min)
source bench/gpu_step.sh
step round 555 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 64,256,16,1024,63,255 --rounds 32 --repeats 3 --stage-repeats 2 --out "$R/round"
finish next_b
