#!/usr/bin/env bash
# Session 18, call 4 (~2 min): where chunk_top_k's 34 us go (bench/probe_topk.py: stripped-down
# kernels of the same grid, by device time), at 4 and 8 warps.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_s18_4.sh
source bench/gpu_step.sh
record_commit
step probe 140 python3 -m bench.probe_topk --warps 4,8 --out "$R/probe"
finish s184
