#!/usr/bin/env bash
# Session 33 (~9 min; one call, for when only one machine start is to be had): s33b's read floor
# and the parts of s33a that decide something. (1) The dispatch probe, now with the state's
# caches stacked (2 leaves a model instead of 2 a layer) and the weights alone: what a stacked
# cache would save a call. (2) Issue 4's read floor (s33b). (3) check_gpu --impl auto (session
# 31's T = 16 default, c8m, over 5 keys). (4) One DDTree-64 run on the defaults.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s33c.sh
source bench/gpu_step.sh
record_commit
step dispatch 100 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
step read_floor 150 python3 -m bench.probe_read_floor --prefixes 4096,8192,16384 \
  --configs 16x64w4s4,32x64w4s4,32x128w4s3,64x64w4s2,16x128w8s4,32x64w8s4,16x256w8s3,8x512w8s3 --out "$R/read_floor"
step check 130 python3 -m bench.check_gpu --impl auto --layers 2
export SECS=90 ROUNDS=32 PROMPT=512
ddtree_rounds d64 ddtree 64
finish s33c
