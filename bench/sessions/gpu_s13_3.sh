#!/usr/bin/env bash
# Session 13, third call (~8 min): (1) issue 4's decode rows again, with a plain XLA read of the
# same K/V bytes in the same chain (bench_kernels --read-floor): how much of the bytes floor a
# call can reach at all at 4k-32k (that read turned out no floor, and the option was replaced by
# --trace after this call; bench/RESULTS.md, session 13); (2) the T = 1025 tile A/B prepared in session 12
# (gpu_next_s13a.sh's second half): DDTree-1024 default vs 64-row tiles + skip, interleaved twice.
# Usage (device tool): bash bench/sessions/gpu_s13_3.sh -> $OUT/s13_3.tar.xz
source bench/gpu_step.sh
record_commit
step decode 170 python3 bench/bench_kernels.py --ts 1 --prefixes 4096,8192,16384,32768 --no-sweep \
  --no-correctness --no-cudnn --read-floor --budget-s 160 --out "$R/decode"
T1025=DDTREE_ATTENTION_TABLE=bench/tables/t1025_m64_skip.json
ROUNDS=16 SECS=120 ddtree_rounds base1 ddtree 1024
ROUNDS=16 SECS=120 ddtree_rounds m64_1 ddtree 1024 "$T1025"
ROUNDS=16 SECS=120 ddtree_rounds m64_2 ddtree 1024 "$T1025"
ROUNDS=16 SECS=120 ddtree_rounds base2 ddtree 1024
finish s13_3
