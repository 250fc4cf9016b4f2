#!/usr/bin/env bash
# Session 20, call 3 (~7 min). The new defaults (the Mosaic GPU kernel for padded T 257-1032 at
# 64x3w2s): (1) check_gpu --impl auto through the target, now at T = 264 with a 4001-token
# prefix (session 20's s20_2 found the 4329-position cache unsupported: TMA needs a multiple of 8;
# the engine's caches are multiples of 128, and check_gpu's now too) and at T = 1032. (2)
# DDTree-1024, 16 rounds: the new default (Mosaic GPU, skip_empty; 58 us a layer alone) against
# the old range 257-520 (Triton with its tuned T = 1025 tiles), same start.
source bench/gpu_step.sh
record_commit
step check 120 python3 -m bench.check_gpu --impl auto --layers 2
ROUNDS=16 SECS=130 ddtree_rounds new1024 ddtree 1024
ROUNDS=16 SECS=130 ddtree_rounds old1024 ddtree 1024 DDTREE_MGPU_ATTENTION=257-520
finish s20_3
