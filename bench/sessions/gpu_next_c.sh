#!/usr/bin/env bash
# Prepared in session 3, run in session 4: issue 4's end-to-end before/after at prefix 8192 (AR and
# DDTree-64, Pallas vs XLA; 512 was measured in session 3), then the PyTorch baseline on the GPU
# (issue 6; session 3's ran on the CPU). Carry [".data"].
# Usage (device tool): DDTREE_COMMIT=<local short hash> bash bench/sessions/gpu_next_c.sh -> $OUT/next_c.tar.xz   (~8 min)
source bench/gpu_step.sh
step round8k 330 python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --attn-impl pallas,xla \
  --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/round8k"
JAX_DEFAULT_MATMUL_PRECISION=highest step torch 150 python3 -m bench --data .data/pystdlib-3.11.7.jsonl.xz \
  --num-prompts 16 --prompt-tokens 256 --max-new-tokens 128 --methods ar --temperatures 0 --repeats 2 \
  --dtype float32 --torch-baseline --torch-device cuda --torch-repeats 1 --profile-prompts 0 --no-plots \
  --time-limit 140 --no-progress --out "$R/torch"
finish next_c
