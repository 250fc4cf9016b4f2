#!/usr/bin/env bash
# Session 24, call a (~9 min): XLA autotune pinning, then session 20's prompt-8192 runs.
# (1) XLA's GEMM autotuner picks differently between process starts (s23a gate_up tst_128x136,
#     s23d tst_192x144 coopB). One run dumps its autotune results (and, where this XLA has the
#     flag, the log of every candidate's time and scratch bytes), two more load them: do the
#     loading runs reproduce the dumping run? The candidates' log says which gate_up algorithms
#     run without the cuBLASLt workspace memset (~0.21 ms a round, sessions 21 and 23).
# (2) DDTree-256 at prompt 8192: the Mosaic GPU kernel (default) against Triton.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s24a.sh
source bench/gpu_step.sh
record_commit
AT="$R/autotune.textproto"
AL="$R/autotune_logs.textproto"
LOGF=""
if XLA_FLAGS="--xla_gpu_dump_autotune_logs_to=/tmp/al.txt" python3 -c \
  'import jax.numpy as j; (j.ones((256,512),"bfloat16")@j.ones((512,256),"bfloat16")).block_until_ready()' \
  > "$R/logs_flag_probe.log" 2>&1; then LOGF="--xla_gpu_dump_autotune_logs_to=$AL"
else echo "this XLA has no --xla_gpu_dump_autotune_logs_to"; tail -3 "$R/logs_flag_probe.log"; fi
export SECS=85 ROUNDS=32
ddtree_rounds at_dump ddtree 64,256 "XLA_FLAGS=--xla_gpu_dump_autotune_results_to=$AT $LOGF"
ls -la "$R"/autotune* 2>&1 | tail -3
ddtree_rounds at_load1 ddtree 64,256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$AT"
ddtree_rounds at_base ddtree 64,256
ddtree_rounds at_load2 ddtree 64,256 "XLA_FLAGS=--xla_gpu_load_autotune_results_from=$AT"
export SECS=90 ROUNDS=16
PROMPT=8192 ddtree_rounds long_new ddtree 256
PROMPT=8192 ddtree_rounds long_old ddtree 256 DDTREE_MGPU_ATTENTION=off
finish s24a
