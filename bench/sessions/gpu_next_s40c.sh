#!/usr/bin/env bash
# Session 40 (~4 min): the decode merge's tile over the caches s40b/s39b left: merge_tile 4096
# (row 0, the default) against 2048 (row 14), interleaved, at 1k / 4k / 8k / 32k keys (at 512
# keys 2048 took the merge from 2.4 to 1.5 us on both cards); then issue 4's decode row (T = 1,
# the engine column) at 4k / 8k / 32k on the same card.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s40c.sh
source bench/gpu_step.sh
record_commit
for P in 4096 32768 8192 1024; do
  decode_tiles merge_$P $P 0,14,0,14 60
done
step table_1 120 python3 bench/bench_kernels.py --ts 1 --prefixes 4096,8192,32768 --no-sweep \
  --split-prefixes "" --no-correctness --budget-s 110 --out "$R/table_1"
finish s40c
