#!/usr/bin/env bash
# Session 9, fourth call (~7 min): the ancestor mask by parent pointers ("chain", the new GPU
# default) against the matmul squaring ("square"; session 9's DDTree-1024 profile: 4 Triton GEMMs
# on pred[1025, 1025], 0.2 of the tree stage's 0.72 ms). (1) bench_tree, whole tree (mask
# included) with each; (2) DDTree-64 / 256 rounds with each, same call; (3) DDTree-1024's stage row
# with the new default (s9a: tree 0.587 ms, round 33.94 steady).
# Usage (device tool): bash bench/sessions/gpu_s9_4.sh -> $OUT/s94.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step tree 100 python3 -m bench.bench_tree --budgets 64,256,1024 --count-max 8192 --ancestor-impl square,chain \
  --out "$R/tree"
for a in square chain; do
  step "rnd_$a" 110 env DDTREE_ANCESTOR_IMPL=$a python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 64,256 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/rnd_$a"
done
step s1024 150 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 1024 \
  --rounds 16 --repeats 3 --stage-loop --out "$R/s1024"
finish s94
