#!/usr/bin/env bash
# Session 33 (~8 min; one call): decode (T = 1) with a 2- or 3-stage ring instead of 4 (s33d's
# tile sweeps), AR rounds interleaved with the default at prompts 512 and 4096
# (DDTREE_ATTENTION_TABLE=bench/tables/t1_stages{2,3}.json: the shipped table plus a T = 1 entry).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s33e.sh
source bench/gpu_step.sh
record_commit
export SECS=60 ROUNDS=32
PROMPT=512 ddtree_rounds ar512_a ar 0
PROMPT=512 ddtree_rounds ar512_s2 ar 0 DDTREE_ATTENTION_TABLE=bench/tables/t1_stages2.json
PROMPT=512 ddtree_rounds ar512_s3 ar 0 DDTREE_ATTENTION_TABLE=bench/tables/t1_stages3.json
PROMPT=4096 ddtree_rounds ar4k_a ar 0
PROMPT=4096 ddtree_rounds ar4k_s2 ar 0 DDTREE_ATTENTION_TABLE=bench/tables/t1_stages2.json
PROMPT=4096 ddtree_rounds ar4k_s3 ar 0 DDTREE_ATTENTION_TABLE=bench/tables/t1_stages3.json
PROMPT=4096 ddtree_rounds ar4k_b ar 0
finish s33e
