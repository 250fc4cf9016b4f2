#!/usr/bin/env bash
# Session 24, call e (~3 min). s24d: with four rounds an inner loop, gate_up's default algorithm
# (B) still ran no faster than algorithm 1 (A) by the wall, though s24c's plain-loop profile had
# it 0.33 ms a round less busy. A graph-mode profile of B with the inner loop: busy, and where
# the idle is.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s24e.sh
source bench/gpu_step.sh
record_commit
B=bench/results/session24/s24b/autotune_gate_up_alg0.textproto
step prof_b_loop4 100 env XLA_FLAGS=--xla_gpu_load_autotune_results_from=$B DDTREE_UNROLL_AS_LOOP=1 \
  python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256/4 --rounds 16 --graphs \
  --out "$R/prof_b_loop4"
finish s24e
