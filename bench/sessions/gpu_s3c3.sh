#!/usr/bin/env bash
# Session 3, device call 3: the benchmark suite's full matrix on the shipped pair (issue 6), both
# temperatures in one process: every row's programs compiled first by 8 threads, then the timed
# rows, then the PyTorch baseline; --time-limit leaves a valid partial bench.json if time runs out.
# Corpus carried as .data/. Usage (device tool, carry [".data"]): bash bench/sessions/gpu_s3c3.sh -> $OUT/s3c3.tar.xz
source bench/gpu_step.sh
JAX_DEFAULT_MATMUL_PRECISION=highest step suite 560 python3 -m bench --data .data/pystdlib-3.11.7.jsonl.xz \
  --num-prompts 32 --prompt-tokens 256 --max-new-tokens 256 --budgets 16,64,256 --policies ddtree,beam:width=4 \
  --temperatures 0,1.0 --repeats 2 --dtype float32 --torch-baseline --torch-repeats 1 --profile-prompts 2 \
  --compile-workers 8 --time-limit 540 --no-progress --out "$R/suite"
finish s3c3
