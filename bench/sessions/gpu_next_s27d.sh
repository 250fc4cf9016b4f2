#!/usr/bin/env bash
# Session 27, fourth call (~3 min): the landed default rule (TAIL_CONFIGS[264], both entries)
# without any override: DDTree-256 at batch 2 and batch 1, prompt 4096 (cache 6784). Expected:
# s27c's 264:64x3w2sot8 (18.8-18.9 ms a call) and s27b's new default (11.1-11.2).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s27d.sh
source bench/gpu_step.sh
record_commit
export SECS=75 ROUNDS=32
PROMPT=4096 ddtree_rounds b2p4096_rule ddtree 256 --batch 2
PROMPT=4096 ddtree_rounds b1p4096_rule ddtree 256
finish s27d
