#!/usr/bin/env bash
# Prepared in session 8 for the next session's first call (~9 min). Session 8 left DDTree-64 at
# 6.31 ms (target 6.0) and 256 at 9.91 (9.0). At 256 the verify's GEMMs are compute-bound except
# o (session 7's profile: cuBLAS at ~355 TFLOP/s useful, 96 output tiles for 132 SMs), and the
# swiglu multiply is its own kernel (0.22 ms a round); XLA's Triton GEMM could fuse it as the
# down product's prologue. One XLA option per row, every row against the default row of the
# same call (XLA_FLAGS applies to the whole process; engine.ROUND_XLA_OPTIONS adds split-K 1 at
# 33-65 rows on top). A winner becomes one ROUND_XLA_OPTIONS line for its row range.
# (1) DDTree-256: default; Triton for every GEMM (triton_gemm_any); cuBLASLt; Triton warp
#     specialization; (2) DDTree-64: default; triton_gemm_any; (3) DDTree-1024 with the session-8
#     defaults (its tree stage in the round; session 7: 0.62 ms).
# Usage (device tool): bash bench/sessions/gpu_next_s9a.sh -> $OUT/s9a.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
rnd() {  # rnd NAME SECONDS BUDGETS [env...]
  local name=$1 secs=$2 budgets=$3; shift 3
  step "$name" "$secs" env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets "$budgets" --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd d256 60 256 DDTREE_X=0
rnd any256 70 256 XLA_FLAGS=--xla_gpu_triton_gemm_any=true
rnd lt256 60 256 XLA_FLAGS=--xla_gpu_enable_cublaslt=true
rnd ws256 70 256 XLA_FLAGS=--xla_gpu_experimental_enable_triton_warp_specialization=true
rnd d64 55 64 DDTREE_X=0
rnd any64 65 64 XLA_FLAGS=--xla_gpu_triton_gemm_any=true
step s1024 150 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 1024 \
  --rounds 16 --repeats 3 --stage-loop --out "$R/s1024"
finish s9a
