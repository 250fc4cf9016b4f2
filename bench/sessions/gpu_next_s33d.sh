#!/usr/bin/env bash
# Session 33 (~6 min; one call): the read floor again, each call's read now seeded by the call
# before (s33c's reads depended on the cache alone, so XLA kept one read per cache copy: 3-10
# for 20 calls), and decode's tile sweep at 4096- and 16384-token prefixes by device time, with 2-3 stages (a 4-stage ring of
# 64-key K and V tiles is 128 KB of shared memory: one program an SM, 256 programs in two waves?).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s33d.sh
source bench/gpu_step.sh
record_commit
step read_floor 150 python3 -m bench.probe_read_floor --prefixes 4096,8192,16384 \
  --configs 32x64w4s4,32x64w4s3,32x64w4s2,16x64w4s2,64x64w4s2,16x128w4s2,32x128w4s2,16x256w8s2 --out "$R/read_floor"
step dec_tiles 160 python3 bench/bench_kernels.py --ts 1 --tile-prefix 4096 --split-prefixes "" --no-table \
  --no-correctness --no-xla --no-cudnn --trace --budget-s 150 --out "$R/dec_tiles"
step dec_tiles16k 130 python3 bench/bench_kernels.py --ts 1 --tile-prefix 16384 --split-prefixes "" --no-table \
  --no-correctness --no-xla --no-cudnn --trace --budget-s 120 --out "$R/dec_tiles16k"
finish s33d
