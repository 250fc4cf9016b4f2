#!/usr/bin/env bash
# Prepared in session 18 for the next session (~9 min; session 18 ran out of device time before
# it). (1) Where chunk_top_k's 34 us go (bench/probe_topk.py: stripped-down kernels of its grid,
# by device time, at 4 and 8 warps): session 18's pruned variant, which skips the radix rounds in
# most chunks, was no faster (36 us), so the time is in the load, the prefix counts, the stores or
# the grid itself; (2) a DDTree-64 profile with session 18's tree (pair_select at every depth:
# where the round's ~0.12 ms tree stage and the rest go now); (3) the round table at session 18's
# defaults (AR, DFlash, DDTree-16 / 64 / 256) on one start; (4) beam_select with session 17's
# accumulator (untimed; s17b's version took 24 / 40 / 85 us at B = 16 / 32 / 64) against XLA's loop.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s19a.sh
source bench/gpu_step.sh
record_commit
step probe 140 python3 -m bench.probe_topk --warps 4,8 --out "$R/probe"
step prof64 110 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 \
  --out "$R/prof64"
SECS=170 ddtree_rounds table ar,dflash,ddtree 16,64,256
step beam 80 python3 -m bench.bench_tree --budgets 16,32,64 --count-max 8192 --beam-kernel-max 0,1000 \
  --repeats 3 --trace --out "$R/beam"
finish s19a
