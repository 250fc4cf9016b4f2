#!/usr/bin/env bash
# Session 21 (~9 min; one call): where DDTree-256's round goes at the defaults (the Mosaic GPU
# kernel at T = 264 with its skip), and whether XLA's GEMM choices at 264 rows cost the gaps s12_1
# saw (cuBLASLt's `Memset 0` and ~4.4 us before each gate_up; o / down split in two K halves and
# reduced by a second kernel): DDTree-256 rounds at the defaults, with Triton GEMMs only
# (xla_gpu_cublas_fallback=false), with cuBLASLt off, and split-K 1, same start.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s21c.sh
source bench/gpu_step.sh
record_commit
step prof256 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --out "$R/prof256"
r256() {  # NAME SECS [--xla-option K=V...]
  local name=$1 secs=$2; shift 2
  step "$name" "$secs" env DDTREE_X=0 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 256 --rounds 32 --repeats 3 --stage-repeats 0 "$@" --out "$R/$name"
}
r256 base 80
r256 nofb 130 --xla-option xla_gpu_cublas_fallback=false
r256 nolt 90 --xla-option xla_gpu_enable_cublaslt=false
r256 sk1 90 --xla-option xla_gpu_experimental_force_split_k=1
finish s21c
