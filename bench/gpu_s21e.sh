#!/usr/bin/env bash
# Session 21 (~3 min; one call), after s21c's profile: DDTree-256's steady round (9.51 ms) is 0.65 ms
# above its busy time (8.86), of which 0.38 are sub-5 us gaps between kernels; the rest sits at the
# while loop's iteration boundary (XLA's while loop copies its predicate to the host every round).
# Does a command buffer that holds the loop itself (WHILE / CONDITIONAL commands: CUDA graph
# conditional nodes) take it away? Interleaved on one start.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_s21e.sh
source bench/gpu_step.sh
record_commit
r256() {  # NAME SECS [--xla-option K=V...]
  local name=$1 secs=$2; shift 2
  step "$name" "$secs" env DDTREE_X=0 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 256 --rounds 32 --repeats 3 --stage-repeats 0 "$@" --out "$R/$name"
}
CBW="--xla-option xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
r256 cbw1 60 $CBW
r256 base1 60
r256 cbw2 60 $CBW
finish s21e
