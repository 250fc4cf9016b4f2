#!/usr/bin/env bash
# Prepared in session 18 for the next session (~9 min; session 18 ran out of device time before
# it). (1) Where chunk_top_k's 34 us go (bench/probe_topk.py: stripped-down kernels of its grid,
# by device time, at 4 and 8 warps): session 18's pruned variant, which skips the radix rounds in
# most chunks, was no faster (36 us), so the time is in the load, the prefix counts, the stores or
# the grid itself; (2) a DDTree-64 profile with session 18's tree (pair_select at every depth:
# where the round's ~0.12 ms tree stage and the rest go now); (3) the round table at session 18's
# defaults (AR, DFlash, DDTree-16 / 64 / 256) on one start; (4) below the shipped thresholds:
# runs_select for B = 16 / 64's final selections (T < 1000, XLA's pairwise rank + inverse +
# gathers now) and pair_select at B = 16 (34 candidates a depth).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s19a.sh
source bench/gpu_step.sh
record_commit
step probe 140 python3 -m bench.probe_topk --warps 4,8 --out "$R/probe"
step prof64 110 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 \
  --out "$R/prof64"
SECS=200 ddtree_rounds table ar,dflash,ddtree 16,64,256
step small 80 python3 -m bench.bench_tree --budgets 16,64 --count-max 8192 --runs-kernel-from 0,1 \
  --pair-kernel-from 1 --repeats 3 --trace --out "$R/small"
finish s19a
