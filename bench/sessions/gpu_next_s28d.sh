#!/usr/bin/env bash
# Session 28, fourth call (~5 min). (1) The landed rule without overrides: DDTree-64 at prompt
# 512 takes ONE_WAVE_CONFIGS[72] (64x4w2kc3) by default now, against Triton (a set range turns it
# off), AB. (2) T = 16 on the Mosaic GPU kernel with its keys over 8 CTAs (64 CTAs at batch 1;
# s28c alone: 9.2 against Triton's 10.3 us over 512, 13.5 against 19.7 over 4096): the drafter's
# block in every round and DFlash's 16-row verify. DDTree-64 at prompt 4096 and DFlash at prompt
# 512, each against the default, AB.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s28d.sh
source bench/gpu_step.sh
record_commit
TRI=DDTREE_MGPU_ATTENTION=256-1032
T16="DDTREE_MGPU_ATTENTION=16-1032 DDTREE_MGPU_CONFIG=16:64x4w2kc8,72:64x4w2kc3,64x3w2so"
export SECS=50 ROUNDS=32 PROMPT=512
ddtree_rounds p512_d64_default ddtree 64
ddtree_rounds p512_d64_tri ddtree 64 $TRI
ddtree_rounds p512_dflash_default dflash 0
ddtree_rounds p512_dflash_t16 dflash 0 $T16
export SECS=55 PROMPT=4096
ddtree_rounds p4096_d64_default ddtree 64
ddtree_rounds p4096_d64_t16 ddtree 64 $T16
finish s28d
