#!/usr/bin/env bash
# Session 24, call c (~6 min). s24b: gate_up pinned to cuBLASLt's default algorithm (B) ran
# DDTree-256 0.13 ms a round faster steady than s24a's picks (A: algorithm 1), but its calls cost
# ~7 ms more fixed, so a 32-round call was a tie. Graph-mode profiles of both (is the memset
# gone? what does a call do before its first round?) and 64-round calls of both.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s24c.sh
source bench/gpu_step.sh
record_commit
A=bench/results/session24/s24a/autotune.textproto
B=bench/results/session24/s24b/autotune_gate_up_alg0.textproto
step prof_a 85 env XLA_FLAGS=--xla_gpu_load_autotune_results_from=$A python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:256 --rounds 16 --graphs --out "$R/prof_a"
step prof_b 85 env XLA_FLAGS=--xla_gpu_load_autotune_results_from=$B python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:256 --rounds 16 --graphs --out "$R/prof_b"
export SECS=70 ROUNDS=64
ddtree_rounds at_a64 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$A"
ddtree_rounds at_b64 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$B"
finish s24c
