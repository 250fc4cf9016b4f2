#!/usr/bin/env bash
# Session 11: the o projection as split-K partials summed inside add_rms_norm
# (target.O_PARTS, DDTREE_O_PARTS), for the 129- and 257-row verify passes: session 7's
# DDTree-256 profile had o on 192 x 72 cuBLAS tiles (88 programs), 24 us a layer, ~350 TFLOP/s.
# (1) bench_gemm: o alone at 129 / 257 rows, one dot vs 2 / 4 parts (+ an XLA sum here).
# (2) DDTree-128 / 256 rounds: default, DDTREE_O_PARTS=2, =4, default again.
# Usage (device tool): bash bench/sessions/gpu_next_s11e.sh -> $OUT/s11e.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step gemm 60 python3 -m bench.bench_gemm --rows 129,257 --shapes o,down --variants xla,split:2,split:4 --out "$R/gemm"
rnd() {  # rnd NAME [env...]
  local name=$1; shift
  step "$name" 100 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets 128,256 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base1 DDTREE_X=0
rnd parts2 DDTREE_O_PARTS=2
rnd parts4 DDTREE_O_PARTS=4
rnd base2 DDTREE_X=0
finish s11e
