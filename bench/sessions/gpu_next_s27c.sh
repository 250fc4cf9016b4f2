#!/usr/bin/env bash
# Session 27, third call (~6 min): the tail split at batch 2. T = 264 at batch 2 runs
# AUTO_CONFIGS[None] (two row blocks a CTA): 2 x 8 x 9 = 144 CTAs, the 9th group (block 17, one
# real token) a second wave. 264:64x3w2sot8 runs the first 8 groups (128 CTAs) in one launch and
# the 9th's keys over 8 CTAs in a second. DDTree-256 rounds at batch 2, prompts 4096 and 8192,
# default against it, interleaved ABAB (4096) and AB (8192).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s27c.sh
source bench/gpu_step.sh
record_commit
T2=DDTREE_MGPU_CONFIG=264:64x3w2sot8
export SECS=75 ROUNDS=32
PROMPT=4096 ddtree_rounds b2p4096_def1 ddtree 256 --batch 2
PROMPT=4096 ddtree_rounds b2p4096_tail1 ddtree 256 $T2 --batch 2
PROMPT=4096 ddtree_rounds b2p4096_def2 ddtree 256 --batch 2
PROMPT=4096 ddtree_rounds b2p4096_tail2 ddtree 256 $T2 --batch 2
PROMPT=8192 ddtree_rounds b2p8192_def1 ddtree 256 --batch 2
PROMPT=8192 ddtree_rounds b2p8192_tail1 ddtree 256 $T2 --batch 2
finish s27c
