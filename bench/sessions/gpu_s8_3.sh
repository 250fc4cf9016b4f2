#!/usr/bin/env bash
# Session 8, third call (~9 min). (1) The stage table with this commit's defaults (split-K 1 for
# the 65-row round executables, t2 at T = 257 for caches <= 4096, the tree build's barrier and
# Pallas first stage); (2) which other verify sizes gain from split-K 1 (DFlash T = 16,
# DDTree-16 / 32 / 128), with and without it, one machine.
# Usage (device tool): bash bench/sessions/gpu_s8_3.sh -> $OUT/s83.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step stages 280 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 16,64,256 --rounds 32 --repeats 3 --stage-loop --out "$R/stages"
rnd() {  # rnd NAME SECONDS [env...]
  local name=$1 secs=$2; shift 2
  step "$name" "$secs" env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods dflash,ddtree --budgets 16,32,128 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd sizes_default 140 DDTREE_X=0
rnd sizes_fsk1 140 XLA_FLAGS=--xla_gpu_experimental_force_split_k=1
finish s83
