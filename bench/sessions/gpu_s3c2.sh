#!/usr/bin/env bash
# Session 3, device call 2: the fused norm / q-k-norm+RoPE kernels and the reworked attention
# kernel on the device: parity with XLA through the target, the attention kernel table, then the
# 8B round (steady state) for AR and DDTree-64 at prefix 512 and 8192, Pallas vs XLA
# (issue 4's end-to-end before/after; issues 2 and 3). Usage: bash bench/sessions/gpu_s3c2.sh -> $OUT/s3c2.tar.xz
source bench/gpu_step.sh
step check 60 python3 -m bench.check_gpu
step kernels 110 python3 bench/bench_kernels.py --out "$R/kernels" --budget-s 85 --ts 1,65 --prefixes 4096,16384 --tile-prefix 0 --split-prefixes 4096 --splits 1,4,16,64 --no-extra --no-cudnn
step round 330 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512,8192 --attn-impl pallas,xla \
  --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/round"
finish s3c2
