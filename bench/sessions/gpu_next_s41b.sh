#!/usr/bin/env bash
# Session 41 (~8 min, Hopper): the verify kernels' softmax with the scale folded into exp2's
# argument (one fused multiply-add a score; the max taken over unscaled scores) against the tree
# before it (8949fe7, in bench/.ab_head: recipe below),
# interleaved base / new twice on one start, bench_mgpu alone (exactness against XLA, then
# cold-cache device span): the Mosaic GPU kernel on the round's configs (T = 72 64x4w2kc3m, T =
# 264 64x3w2so for short caches and 64x4w2kst8 for long ones) and the Triton kernel at T = 72.
# bench/.ab_head (ignored by git): bench/ab_tree.sh 8949fe7 bench/.ab_head
# Usage (device tool, carry bench/.device_commit and bench/.ab_head):
#   BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s41b.sh
source bench/gpu_step.sh
record_commit
mg() {  # mg NAME DIR TS CONFIGS PREFIXES
  step "$1" 75 bash -c 'cd "$0" && exec python3 -m bench.bench_mgpu --ts "$1" --configs "$2" --prefixes "$3" --out "$4"' \
    "$2" "$3" "$4" "$5" "$R/$1"
}
ab() {  # ab R: one interleaved base / new pair of both T
  mg base72_$1 bench/.ab_head 72 64x4w2kc3m,triton 512,4096,32768
  mg new72_$1 . 72 64x4w2kc3m,triton 512,4096,32768
  mg base264_$1 bench/.ab_head 264 64x3w2so,64x4w2kst8 512,4096,32768
  mg new264_$1 . 264 64x3w2so,64x4w2kst8 512,4096,32768
}
ab a
# The on-device checks between the pairs (the Triton kernel is decode's too): bench_kernels'
# correctness cases and check_gpu's target layers, compiled kernels against XLA.
step correct 100 python3 bench/bench_kernels.py --ts 1 --no-sweep --split-prefixes "" --no-table --budget-s 90 \
  --out "$R/correct"
step check 100 python3 -m bench.check_gpu --impl auto --layers 2
ab b
finish s41b
