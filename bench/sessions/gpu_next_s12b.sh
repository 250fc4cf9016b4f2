#!/usr/bin/env bash
# Prepared in session 11 (~4 min; after gpu_next_s12a.sh): profiles of DDTree-256 and
# DDTree-1024 with today's defaults. The last 256 profile is session 7's (before split-K 1 at
# 33-65 rows, the t2 tiles at T = 257, the chain mask, the threshold first stage); 256 is the
# largest gap to its target (~1 ms), so this says where the next millisecond is.
# Usage (device tool): bash bench/sessions/gpu_next_s12b.sh -> $OUT/s12b.tar.xz
source bench/gpu_step.sh
record_commit
step prof256 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 --rounds 32 \
  --out "$R/prof256"
step prof1024 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:1024 --rounds 8 \
  --out "$R/prof1024"
finish s12b
