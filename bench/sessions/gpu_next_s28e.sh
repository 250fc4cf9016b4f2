#!/usr/bin/env bash
# Session 28, fifth call (~3 min, the session's last device seconds): issue 4's decode at 4k-8k
# (54 / 74 % of the bytes floor on the Triton kernel: 7.8 us of attention + 1.9 of merge at 4k,
# session 14). Would the Mosaic GPU kernel, one query row padded to 8 (8 x 4 = 32 of a block's
# 64 rows) with its keys over 8 or 16 CTAs (64 / 128 CTAs, TMA-pipelined), read faster? Alone,
# caches HBM-cold: T = 1 on Triton (the decode path) against T = 8 on Triton and Mosaic GPU.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=200 bash bench/sessions/gpu_next_s28e.sh
source bench/gpu_step.sh
record_commit
step decode1 50 python3 -m bench.bench_mgpu --ts 1 --prefixes 4096,8192 --configs triton --inner 8 --out "$R/decode1"
step decode8 90 python3 -m bench.bench_mgpu --ts 8 --prefixes 4096,8192 \
  --configs triton,64x4w2kc8,64x4w2kc16,64x4w1c16 --inner 8 --out "$R/decode8"
finish s28e
