#!/usr/bin/env bash
# Session 21 (~7 min; one call), after s21c: the gate_up GEMM at 264 rows is cuBLASLt's algorithm 1
# (nvjet tst 128x136, 2x1 cluster), preceded by a `Memset 0` and a ~4.4 us gap every layer (~0.2 ms
# a round); o and down are split-K 2 batched GEMMs plus a reduce. A / B, interleaved on one start:
# cuBLASLt off (legacy cuBLAS), XLA's autotuning off (level 0: each GEMM's first heuristic choice),
# cuBLASLt off + split-K 1; then profiles of the first two.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s21d.sh
source bench/gpu_step.sh
record_commit
r256() {  # NAME SECS [--xla-option K=V...]
  local name=$1 secs=$2; shift 2
  step "$name" "$secs" env DDTREE_X=0 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 256 --rounds 32 --repeats 3 --stage-repeats 0 "$@" --out "$R/$name"
}
NOLT="--xla-option xla_gpu_enable_cublaslt=false"
AL0="--xla-option xla_gpu_autotune_level=0"
r256 base1 70
r256 nolt1 70 $NOLT
r256 al01 90 $AL0
r256 noltsk1 70 $NOLT --xla-option xla_gpu_experimental_force_split_k=1
r256 base2 70
r256 nolt2 70 $NOLT
r256 al02 80 $AL0
prof() {  # NAME [--xla-option K=V...]
  local name=$1; shift
  step "$name" 80 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
    --rounds 16 "$@" --out "$R/$name"
}
prof prof_nolt $NOLT
prof prof_al0 $AL0
finish s21d
