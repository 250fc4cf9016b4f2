#!/usr/bin/env bash
# Session 14, call 2: the one-kernel depth loop (pallas_kernels/beam_select.py) against XLA's ops:
# the build alone by device time at B = 16 / 64 / 128, then DDTree-16/64 rounds interleaved; decode
# prefix chunks at 1k / 2k / 16k / 32k (4k / 8k ran in s14_1).
# Usage (device tool): bash bench/sessions/gpu_s14_2.sh -> $OUT/s14_2.tar.xz
source bench/gpu_step.sh
record_commit
step tree 170 python3 -m bench.bench_tree --budgets 16,64,128 --count-max 8192 --beam-kernel-max 0,1024 --trace --out "$R/tree"
ddtree_rounds beam_a ddtree 16,64
ddtree_rounds xla_a ddtree 16,64 DDTREE_BEAM_KERNEL_MAX=0
ddtree_rounds beam_b ddtree 16,64
step splits 100 python3 bench/bench_kernels.py --ts 1 --split-prefixes 1024,2048,16384,32768 --t-splits 1=4,8,16,32,64 \
  --tile-prefix 0 --no-table --no-correctness --trace --budget-s 90 --out "$R/splits"
finish s14_2
