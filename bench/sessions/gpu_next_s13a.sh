#!/usr/bin/env bash
# Prepared in session 12 for the next session's first call (~4 min now).
# (1) DDTree-256 profiles with today's defaults (the 64-row T = 257 tiles) and with cuBLASLt off:
#     s12_1's profile found a cuBLASLt memset before every verify gate_up GEMM at 257 rows and a
#     ~4.4 us idle gap after it (~0.2 ms a round); s12_2 found cuBLASLt off no faster, but did
#     not profile whether the memset went.
# (2) DDTree-1024 with the 64-row tiles and the skip at T = 1025 (bench/tables/t1025_m64_skip.json)
#     against the default (128x128 tiles, 8 warps, skip on at 9 steps), same call, twice.
# Session 13 ran part (2) as bench/sessions/gpu_s13_3.sh (shipped: the T = 1025 entry) and removed it
# here; part (1) has not run yet.
# Usage (device tool): bash bench/sessions/gpu_next_s13a.sh -> $OUT/s13a.tar.xz
source bench/gpu_step.sh
record_commit
step prof256 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 32 --out "$R/prof256"
step prof256_nolt 150 env XLA_FLAGS=--xla_gpu_enable_cublaslt=false python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:256 --rounds 32 --out "$R/prof256_nolt"
finish s13a
