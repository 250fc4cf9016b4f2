#!/usr/bin/env bash
# Session 25, call b (~8 min). The tree: 628b879 (overlap in the default config) + 466245e (the
# output store waits only for its shared-memory reads; normalization by a reciprocal). Base:
# bench/.ab_base = 596e340 (`git archive 596e340 ddtree_jax pallas_kernels bench | tar -x -C
# bench/.ab_base`, bench/results dropped), carried.
# (1) the kernel alone, new against base, same configs (the store change alone); (2) DDTree-256
# rounds, new defaults against base, interleaved x2; (3) DDTree-1024, 16 rounds, new against base.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_next_s25b.sh
source bench/gpu_step.sh
record_commit
ALONE="--ts 72,264,1032 --prefixes 512 --configs 64x4w2ks,64x3w2so --inner 8"
step alone_new 80 python3 -m bench.bench_mgpu $ALONE --out "$R/alone_new"
step alone_base 80 bash -c 'cd bench/.ab_base && exec "$@"' _ python3 -m bench.bench_mgpu $ALONE --out "$R/alone_base"
step alone4k_new 40 python3 -m bench.bench_mgpu --ts 264 --prefixes 4096 --configs 64x3w2so --inner 8 --out "$R/alone4k_new"
step alone4k_base 40 bash -c 'cd bench/.ab_base && exec "$@"' _ python3 -m bench.bench_mgpu --ts 264 --prefixes 4096 \
  --configs 64x3w2so --inner 8 --out "$R/alone4k_base"
export SECS=55 ROUNDS=32
for i in 1 2; do
  ddtree_rounds new$i ddtree 256
  base_rounds base$i ddtree 256
done
export SECS=75 ROUNDS=16
ddtree_rounds new1024 ddtree 1024
base_rounds base1024 ddtree 1024
finish s25b
