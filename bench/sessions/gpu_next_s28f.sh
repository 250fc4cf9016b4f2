#!/usr/bin/env bash
# Session 28, sixth call (~4 min, the last device seconds): DDTree-64 at batch 2, where
# ONE_WAVE_CONFIGS[72]'s 240 CTAs are two waves and Triton runs (the unsplit 64x4w2k, 80 CTAs,
# tied Triton at prompt 4096 in s28b). Is the key split faster even in two waves? Triton against
# c3 forced, at prompts 4096 and 512.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=225 bash bench/sessions/gpu_next_s28f.sh
source bench/gpu_step.sh
record_commit
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=50 ROUNDS=32 PROMPT=4096
ddtree_rounds b2p4096_d64_tri ddtree 64 --batch 2
ddtree_rounds b2p4096_d64_c3 ddtree 64 $C3 --batch 2
export PROMPT=512
ddtree_rounds b2p512_d64_tri ddtree 64 --batch 2
ddtree_rounds b2p512_d64_c3 ddtree 64 $C3 --batch 2
finish s28f
