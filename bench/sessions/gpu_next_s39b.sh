#!/usr/bin/env bash
# Session 39 (~5 min): the decode merge's tile at short caches (gpu_next_s38e.sh's second half).
# s38d's H200 table had the merge at 2.9 us a call over a 1024-key cache (17 parts: 128 columns a
# program, 32 programs) against 1.9 us from 2048 keys (33 parts: 64 columns, 64 programs); a
# 512-token prompt's AR steps have fewer parts still. Rows of bench_kernels' T = 1 list (as of
# this commit): 0 the default (merge_tile 4096), 14-16 merge_tile 2048 / 1024 / 512; twice each,
# at 512 / 1024 / 2048 keys.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s39b.sh
source bench/gpu_step.sh
record_commit
for P in 512 1024 2048; do
  decode_tiles merge_$P $P 0,14,15,16,0,14,15,16 80
done
finish s39b
