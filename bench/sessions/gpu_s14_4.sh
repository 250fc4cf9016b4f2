#!/usr/bin/env bash
# Session 14, call 4: decode with the new split rule (32 chunks of >= 64 keys, <= 512 keys a
# chunk) by device time at 1k-32k, and AR rounds interleaved with the old rule
# (bench/tables/t1_old_splits.json: 528 programs, 512-key chunks at least).
# Usage (device tool): bash bench/sessions/gpu_s14_4.sh -> $OUT/s14_4.tar.xz
source bench/gpu_step.sh
record_commit
step decode 100 python3 bench/bench_kernels.py --ts 1 --prefixes 1024,2048,4096,8192,16384,32768 --no-sweep \
  --no-correctness --no-cudnn --no-xla --trace --out "$R/decode"
SECS=80 ddtree_rounds new_a ar 64
SECS=80 ddtree_rounds old_a ar 64 DDTREE_ATTENTION_TABLE=bench/tables/t1_old_splits.json
SECS=80 ddtree_rounds new_b ar 64
finish s14_4
