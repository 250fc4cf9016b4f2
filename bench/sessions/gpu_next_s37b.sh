#!/usr/bin/env bash
# Session 37 (~5 min; one call): the shipped pair end to end on the GPU at today's defaults. Its
# only GPU suite is session 3's (AR 4801 tok/s, DFlash 1.31x, DDTree-16 0.83x, float32), from
# before the fused round, the device tree build and every kernel since. float32 greedy (checked
# against AR token by token) and temperature 1, AR / DFlash / DDTree 16 and 64 (ddtree policy).
# Usage (device tool, carry bench/.device_commit and .data): make .data/pystdlib-small.jsonl as
# gpu_next_s35c.sh's header says, then BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s37b.sh
source bench/gpu_step.sh
record_commit
step suite 400 python3 -m bench --data .data/pystdlib-small.jsonl --num-prompts 8 --max-new-tokens 128 \
  --methods ar,dflash,ddtree --budgets 16,64 --policies ddtree --temperatures 0,1.0 --repeats 3 \
  --profile-prompts 0 --dtype float32 --compile-workers 4 --time-limit 390 --no-progress --out "$R/suite"
rm -f "$R"/suite/*.png
finish s37b
