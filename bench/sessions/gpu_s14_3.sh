#!/usr/bin/env bash
# Session 14, call 3: the one-kernel depth loop with rolled loops (s14_2's unrolled kernel took
# minutes to compile at B = 64): the build alone at B = 16 / 64 / 128, then DDTree-16/64 rounds
# interleaved with XLA's depth loop.
# Usage (device tool): bash bench/sessions/gpu_s14_3.sh -> $OUT/s14_3.tar.xz
source bench/gpu_step.sh
record_commit
step tree 150 python3 -m bench.bench_tree --budgets 16,64,128 --count-max 8192 --beam-kernel-max 0,1024 --trace --out "$R/tree"
ddtree_rounds beam_a ddtree 16,64
ddtree_rounds xla_a ddtree 16,64 DDTREE_BEAM_KERNEL_MAX=0
ddtree_rounds beam_b ddtree 16,64
finish s14_3
