#!/usr/bin/env bash
# Session 29, first call (~9 min). (1) Where a call's fixed cost comes from (bench/probe_call_fixed.py):
# fresh state buffers every call (bench_round, generate) against the previous call's caches or
# whole state donated to the prefill, and against streaming calls on one state; DDTree-64,
# DDTree-256, AR. (2) Prepared in session 28: DDTree-64 at batch 2 over a long cache, Triton
# against 64x4w2kc3 forced (two waves there), ABAB at prompt 4096 (s28f had no same-start pair).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s29a.sh
source bench/gpu_step.sh
record_commit
step fixed64 100 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --out "$R/fixed64"
step fixed256 100 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 256 --out "$R/fixed256"
step fixedar 80 python3 -m bench.probe_call_fixed --model qwen3-8b --method ar --budget 0 --out "$R/fixedar"
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=60 ROUNDS=32 PROMPT=4096
ddtree_rounds b2p4096_tri1 ddtree 64 --batch 2
ddtree_rounds b2p4096_c3a ddtree 64 $C3 --batch 2
ddtree_rounds b2p4096_tri2 ddtree 64 --batch 2
ddtree_rounds b2p4096_c3b ddtree 64 $C3 --batch 2
finish s29a
