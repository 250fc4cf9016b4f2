#!/usr/bin/env bash
# Session 12, third call (~6 min). (1) DDTree-1024 rounds with and without skipping empty new-key
# steps (SKIP_MIN_STEPS: on at T = 1025), same call. (2) DDTree-256 rounds: the default (t2, no
# skip at 3 steps) against s12_2's fastest tile alone (64x64, 4 warps, 3 stages, one part, 64 new
# keys a step, skip). (3) T = 1025 tiles alone at prefix 512 on DDTree trees.
# Usage (device tool): bash bench/sessions/gpu_s12_3.sh -> $OUT/s12_3.tar.xz
source bench/gpu_step.sh
record_commit
r1024() {  # r1024 NAME [env...]
  local name=$1; shift
  step "$name" 120 env DDTREE_X=0 "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 1024 --rounds 16 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
r1024 skip1024
r1024 k0_1024 DDTREE_ATTENTION_TABLE=bench/tables/t1025_noskip.json
ddtree_rounds base256 ddtree 256
ddtree_rounds m64_256 ddtree 256 DDTREE_ATTENTION_TABLE=bench/tables/t257_m64_b64_skip.json
step attn1025 110 python3 -m bench.attn_configs --ts 1025 --prefix 512 --trees ddtree --budget-s 80 \
  --configs "1025=table,128x128w8s3k0,128x64w8s4,64x64w4s3" --out "$R/attn1025"
finish s12_3
