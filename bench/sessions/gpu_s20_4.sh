#!/usr/bin/env bash
# Session 20, call 4 (~2 min, the budget's rest): DDTree-256's round at the new defaults
# (Mosaic GPU attention with skip_empty at T = 264), profiled: where a verify layer's time goes.
source bench/gpu_step.sh
record_commit
step prof256 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --out "$R/prof256"
finish s20_4
