#!/usr/bin/env bash
# Session 23 (~5 min; one call). s23a's graph-mode profile (prof_graph) shows DDTree-256's idle:
# 0.40-0.49 ms between the loop predicate's MemcpyD2H and the next round's first draft kernel,
# every round (wall 9.55 against 9.04 busy). What does the host do then? profile_round now sums
# the host events inside the device's >50 us gaps (host_in_gaps) and keeps the raw trace.
# (1) the default, graph mode; (2) the loop inside the command buffer (WHILE / CONDITIONAL), graph
# mode: does the gap go, and what replaces it (s22a's WHILE ran 0.1-0.25 ms slower steady, and
# its profile ran op by op); (3) DDTree-64 graph mode, for its share.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s23d.sh
source bench/gpu_step.sh
record_commit
CBW="--xla-option xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL"
step prof_host 80 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --graphs --out "$R/prof_host"
step prof_while 90 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --graphs $CBW --out "$R/prof_while"
step prof64 80 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 \
  --rounds 16 --graphs --out "$R/prof64"
finish s23d
