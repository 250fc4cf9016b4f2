#!/usr/bin/env bash
# Session 11: programmatic dependent launch. jaxlib's XLA has `xla_gpu_enable_pdl` (openxla
# PR 38544: griddepcontrol.wait at the start of XLA's own kernels, so the next launch overlaps
# the previous kernel's tail); whether JAX 0.11.2 turns it on by default is not known here.
# AR and DDTree-64 rounds: default, PDL on, PDL off, default again (one process each).
# Usage (device tool): bash bench/sessions/gpu_next_s11d.sh -> $OUT/s11d.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
rnd() {  # rnd NAME [env...]
  local name=$1; shift
  step "$name" 110 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,ddtree \
    --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base1 DDTREE_X=0
rnd pdl_on XLA_FLAGS=--xla_gpu_enable_pdl=true
rnd pdl_off XLA_FLAGS=--xla_gpu_enable_pdl=false
rnd base2 DDTREE_X=0
finish s11d
