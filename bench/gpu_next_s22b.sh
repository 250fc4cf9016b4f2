#!/usr/bin/env bash
# Prepared in session 21 for the next session (~8 min; one call).
# (1) Token maps (--draft-vocab, new in session 21): the draft's LM head cut to 32768 of 151936
#     columns (what a Qwen3 map of the most frequent tokens would hold), DDTree-64 and -256 against
#     the full head, same start. Expected: ~0.22 ms a round less (1.24 GB -> 0.27 GB of head).
# (2) Session 20's gpu_next_s21a.sh, never run: DDTree-256 at prompt 8192 and at batch 2, the
#     default (the Mosaic GPU kernel at T = 264) against DDTREE_MGPU_ATTENTION=off (Triton).
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s22b.sh
source bench/gpu_step.sh
record_commit
export SECS=60
ddtree_rounds dv64 ddtree 64 --draft-vocab 32768
ddtree_rounds full64 ddtree 64
ddtree_rounds dv256 ddtree 256 --draft-vocab 32768
ddtree_rounds full256 ddtree 256
# DDTree-256 at prompt 8192 and at batch 2, 16 rounds
export SECS=90 ROUNDS=16
PROMPT=8192 ddtree_rounds long_new ddtree 256
PROMPT=8192 ddtree_rounds long_old ddtree 256 DDTREE_MGPU_ATTENTION=off
ddtree_rounds b2_new ddtree 256 --batch 2
ddtree_rounds b2_old ddtree 256 DDTREE_MGPU_ATTENTION=off --batch 2
finish s22b
