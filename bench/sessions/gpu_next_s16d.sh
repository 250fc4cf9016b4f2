#!/usr/bin/env bash
# Session 16 (~5 min): the round table with this session's defaults (AR, DFlash, DDTree-16 / 64 /
# 256, then DDTree-1024 at 16 rounds, then DDTree-64 once more).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s16d.sh
source bench/gpu_step.sh
record_commit
SECS=200 ddtree_rounds table ar,dflash,ddtree 16,64,256
ROUNDS=16 SECS=130 ddtree_rounds b1024 ddtree 1024
SECS=70 ddtree_rounds b64 ddtree 64
finish s16d
