#!/usr/bin/env bash
# Session 27, second call (~6 min): TAIL_CONFIGS[264] (64x4w2kst8 from 5120 cache positions) as
# the default, DDTree-256 rounds at prompts 4096 (cache 6784) and 8192 (cache 10880) against
# the previous default forced (264:64x3w2so), interleaved ABAB.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s27b.sh
source bench/gpu_step.sh
record_commit
OLD=DDTREE_MGPU_CONFIG=264:64x3w2so
export SECS=70 ROUNDS=32
for p in 4096 8192; do
  PROMPT=$p ddtree_rounds p${p}_new1 ddtree 256
  PROMPT=$p ddtree_rounds p${p}_old1 ddtree 256 $OLD
  PROMPT=$p ddtree_rounds p${p}_new2 ddtree 256
  PROMPT=$p ddtree_rounds p${p}_old2 ddtree 256 $OLD
done
finish s27b
