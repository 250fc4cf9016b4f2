#!/usr/bin/env bash
# Session 31, fourth call (~7 min): the drafter's block (T = 16) on ONE_WAVE_CONFIGS[16] (c8m,
# default since this commit) against Triton ($DDTREE_MGPU_ATTENTION=72-1032 leaves T = 72 as the
# default and sends T = 16 to Triton), at prompt 512: DDTree-64 and DFlash, then batch 2 (where
# the default's T = 72 is Triton below 5120 cache positions, so 256-1032 differs only at T = 16).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s31d.sh
source bench/gpu_step.sh
record_commit
export SECS=65 ROUNDS=32 PROMPT=512
SECS=90 ddtree_rounds d64_c8m ddtree 64
ddtree_rounds d64_tri16 ddtree 64 DDTREE_MGPU_ATTENTION=72-1032
ddtree_rounds dflash_c8m dflash 0
ddtree_rounds dflash_tri16 dflash 0 DDTREE_MGPU_ATTENTION=72-1032
SECS=75 ddtree_rounds b2_c8m ddtree 64 --batch 2
SECS=75 ddtree_rounds b2_tri16 ddtree 64 DDTREE_MGPU_ATTENTION=256-1032 --batch 2
finish s31d
