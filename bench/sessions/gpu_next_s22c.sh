#!/usr/bin/env bash
# Ran in session 22 (bench/RESULTS.md "Session 22"). $DDTREE_GATE_UP existed in commits b8c8840-65ed021
# only: the layouts lost (AR +0.29 ms, DDTree-64 +0.10, DDTree-256 a tie) and the knob was removed.
# Session 22: the gate/up GEMM's memset (s21c: cuBLASLt's algorithm for the fused
# [264, 4096] @ [4096, 24576] product zeroes a workspace first and starts ~5 us late, 36 times a
# round, ~0.27 ms of DDTree-256's 9.5). The same round with the other gate/up layouts of
# target.fuse_params ($DDTREE_GATE_UP: pair = two GEMMs, stacked = one batched GEMM, fused_t = the
# transposed operand), cuBLAS then picks other kernels: timed, then profiled (did the memset go?).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s22c.sh
source bench/gpu_step.sh
record_commit
export SECS=60
ddtree_rounds base1 ddtree 256
ddtree_rounds pair1 ddtree 256 DDTREE_GATE_UP=pair
ddtree_rounds stacked1 ddtree 256 DDTREE_GATE_UP=stacked
ddtree_rounds fused_t1 ddtree 256 DDTREE_GATE_UP=fused_t
for v in stacked pair fused_t; do
  step "prof_$v" 75 env DDTREE_GATE_UP=$v python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree:256 --rounds 16 --out "$R/prof_$v"
done
finish s22c
