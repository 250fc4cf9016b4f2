#!/usr/bin/env bash
# Session 7, third call (~7 min): what s7c's time limits cut off (DDTree-1024 and the int8 drafter
# with the stage loop) and a profiler breakdown of the DDTree-64 / 256 rounds by kernel kind at
# this commit (the last was session 2's): where the verify's extra ms over AR's go.
# Usage (device tool): bash bench/sessions/gpu_next_s7d.sh -> $OUT/s7d.tar.xz
source bench/gpu_step.sh
step profile 200 python3 -m bench.profile_round --model qwen3-8b --methods ddtree:64,ddtree:256 --rounds 8 --out "$R/profile"
step int8 150 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-loop --drafter-quant int8 --out "$R/int8"
step stages1024 220 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
  --budgets 1024 --rounds 16 --repeats 3 --stage-loop --out "$R/stages1024"
finish s7d
