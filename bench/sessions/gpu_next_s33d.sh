#!/usr/bin/env bash
# Session 33 (~4 min; one call): the read floor again, each call's read now seeded by the call
# before (s33c's reads depended on the cache alone, so XLA kept one read per cache copy: 3-10
# for 20 calls), and decode's tile sweep at a 4096-token prefix by device time.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s33d.sh
source bench/gpu_step.sh
record_commit
step read_floor 150 python3 -m bench.probe_read_floor --prefixes 4096,8192,16384 \
  --configs 16x64w4s4,32x64w4s4,32x128w4s3,64x64w4s2,16x128w8s4,32x64w8s4,16x256w8s3,64x64w8s3 --out "$R/read_floor"
step dec_tiles 130 python3 bench/bench_kernels.py --ts 1 --tile-prefix 4096 --split-prefixes "" --no-table \
  --no-correctness --no-xla --no-cudnn --trace --budget-s 120 --out "$R/dec_tiles"
finish s33d
