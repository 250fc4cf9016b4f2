#!/usr/bin/env bash
# Session 24, call d (~5 min). s24c's graph-mode profiles: gate_up on cuBLASLt's default algorithm
# (B: nvjet tst_192x144 coopB, no memset) is 0.33 ms a round less device time than s24a's picks
# (A: algorithm 1, tst_128x136 behind a memset), but its round graph's host launch is longer
# (cuGraphLaunch 1.39 against 0.30 ms a round, traced), so plain rounds gain ~0.1 at most. With
# four rounds an inner loop (DDTREE_UNROLL_AS_LOOP=1 --unroll 4, session 23) the host launches the
# next graph while the device works: does B's device saving then show? Interleaved A, B, A, B.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s24d.sh
source bench/gpu_step.sh
record_commit
A=bench/results/session24/s24a/autotune.textproto
B=bench/results/session24/s24b/autotune_gate_up_alg0.textproto
export SECS=62 ROUNDS=32
for i in 1 2; do
  ddtree_rounds loop_a$i ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$A" DDTREE_UNROLL_AS_LOOP=1 --unroll 4
  ddtree_rounds loop_b$i ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$B" DDTREE_UNROLL_AS_LOOP=1 --unroll 4
done
finish s24d
