#!/usr/bin/env bash
# Prepared in session 25 for the next session (~8 min; one call). Session 25 found that the
# 257th verify row of DDTree-256 costs ~0.3 ms of GEMMs (cuBLAS's tiles at 264 rows) and ~0.2 ms
# of attention (a second wave) a round, and shipped the one-wave kernel at T = 256: DDTree-255
# 9.498 / 9.270 against DDTree-256 9.828 / 9.686 on one (slow) start.
# (1) DDTree-255 against -256, two more interleaved pairs (does the 0.33 ms hold);
# (2) the same question at 64: XLA's GEMMs at 64 / 65 / 72 rows and DDTree-63 (64 verify rows)
#     against -64 (65), interleaved;
# (3) a graph-mode profile of DDTree-255 (where its remaining time goes).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s26a.sh
source bench/gpu_step.sh
record_commit
export SECS=50 ROUNDS=32
for i in 1 2; do
  ddtree_rounds d256_$i ddtree 256
  ddtree_rounds d255_$i ddtree 255
done
step gemm64 60 python3 -m bench.bench_gemm --rows 64,65,72 --shapes qkv,o,gate_up,down,lm_head --variants xla \
  --trace all --reps 5 --budget-s 55 --out "$R/gemm64"
for i in 1 2; do
  ddtree_rounds d64_$i ddtree 64
  ddtree_rounds d63_$i ddtree 63
done
step prof255 90 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:255 \
  --rounds 16 --graphs --out "$R/prof255"
finish s26a
