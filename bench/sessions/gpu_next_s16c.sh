#!/usr/bin/env bash
# Session 16 (~6 min): the skinny-matmul table's entries for the split-K-1 round executables (the
# drafter's qkv, ctx_kv and fc at 16 rows, `xla_options`), DDTree-64 rounds with the shipped table
# against an empty one, interleaved; then a DDTree-64 profile with the table.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s16c.sh
source bench/gpu_step.sh
record_commit
echo '{"NVIDIA H200": []}' > "$R/empty_table.json"
SECS=100 ddtree_rounds table_a ddtree 64
SECS=100 ddtree_rounds none_a ddtree 64 DDTREE_MATMUL_TABLE="$R/empty_table.json"
SECS=100 ddtree_rounds table_b ddtree 64
SECS=100 ddtree_rounds none_b ddtree 64 DDTREE_MATMUL_TABLE="$R/empty_table.json"
step prof64 110 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 \
  --out "$R/prof64"
finish s16c
