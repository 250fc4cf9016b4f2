#!/usr/bin/env bash
# Prepared in session 22 for the next session (~8 min; one call).
# (1) Session 20's DDTree-256 runs never made (gpu_next_s22b.sh's second half; its token-map half
#     ran in session 22 as s22e): prompt 8192 and batch 2, the default (the Mosaic GPU kernel at
#     T = 264) against DDTREE_MGPU_ATTENTION=off (Triton).
# (2) XLA's GEMM autotuner picks differently between process starts (session 22: s21c and s22d's
#     profiles of one tree differ in half the o/down kernels, busy 8.86 against 9.08 ms). One run
#     dumps its autotune results, two more load them: do the loading runs reproduce the dumping
#     run's time? If so, a shipped results file per device kind and XLA version could pin the
#     best picks.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s23b.sh
source bench/gpu_step.sh
record_commit
export SECS=90 ROUNDS=16
PROMPT=8192 ddtree_rounds long_new ddtree 256
PROMPT=8192 ddtree_rounds long_old ddtree 256 DDTREE_MGPU_ATTENTION=off
ddtree_rounds b2_new ddtree 256 --batch 2
ddtree_rounds b2_old ddtree 256 DDTREE_MGPU_ATTENTION=off --batch 2
export SECS=55 ROUNDS=32
AT="$R/autotune.textproto"
ddtree_rounds at_dump ddtree 256 "XLA_FLAGS=--xla_gpu_dump_autotune_results_to=$AT"
ls -la "$AT" 2>&1 | tail -1
ddtree_rounds at_load1 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$AT"
ddtree_rounds at_base ddtree 256
ddtree_rounds at_load2 ddtree 256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$AT"
finish s23b
