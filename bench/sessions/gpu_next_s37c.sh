#!/usr/bin/env bash
# Session 37 (~8 min; one call): why the shipped pair's DDTree-64 round takes 3.47 ms where
# DDTree-16's takes 0.87 and DFlash's 0.48 (s37b, H100, float32). bench_round on the pair's
# shapes (random weights) with every stage alone in a device loop, float32 and bf16; then a
# graph-mode profile of DDTree-16 / -64 in float32 (kernels per stage and kind).
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s37c.sh
source bench/gpu_step.sh
record_commit
A="--model shipped --prompt-len 256 --methods ar,dflash,ddtree --budgets 16,64 --rounds 32 --repeats 3 --stage-loop"
step f32 170 python3 -m bench.bench_round $A --dtype float32 --out "$R/f32"
step prof 150 python3 -m bench.profile_round --model shipped --prompt-len 256 --methods ddtree:16,ddtree:64 \
  --rounds 16 --graphs --dtype float32 --out "$R/prof"
step bf16 170 python3 -m bench.bench_round $A --dtype bfloat16 --out "$R/bf16"
rm -f "$R"/*/*.png
finish s37c
