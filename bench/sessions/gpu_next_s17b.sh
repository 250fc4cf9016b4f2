#!/usr/bin/env bash
# Session 17 (~7 min): DDTree's tie rule by position (no lexicographic rank a depth) and the
# rewritten one-kernel depth loop (pallas_kernels/beam_select.py: candidates in registers, the
# rank counted against a scratch row, two barriers a depth). (1) check_tree with the kernel forced
# on against plain XLA at B = 16 / 64 / 128; (2) the build by device time, XLA's depth loop
# against the kernel (8 and 4 warps) at B = 16 / 32 / 64 / 128; (3) DDTree-64 and DDTree-16 rounds:
# the kernel on, off, and the base tree (bench/.ab_base: d10d5fc, the lexicographic tie rule),
# interleaved.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_next_s17b.sh
source bench/gpu_step.sh
record_commit
step check 100 python3 -m bench.check_tree --budgets 16,64,128
step tree8 100 python3 -m bench.bench_tree --budgets 16,32,64,128 --beam-kernel-max 0,1000 --repeats 3 --trace \
  --out "$R/tree8"
step tree4 80 env DDTREE_BEAM_KERNEL_WARPS=4 python3 -m bench.bench_tree --budgets 16,64,128 --beam-kernel-max 1000 \
  --repeats 3 --trace --out "$R/tree4"
SECS=75 ddtree_rounds k64_a ddtree 64 DDTREE_BEAM_KERNEL_MAX=1000
SECS=75 ddtree_rounds x64_a ddtree 64
SECS=75 base_rounds base64_a ddtree 64
SECS=75 ddtree_rounds k64_b ddtree 64 DDTREE_BEAM_KERNEL_MAX=1000
SECS=75 ddtree_rounds x64_b ddtree 64
SECS=75 ddtree_rounds k16 ddtree 16 DDTREE_BEAM_KERNEL_MAX=1000
SECS=75 ddtree_rounds x16 ddtree 16
finish s17b
