#!/usr/bin/env bash
# Session 6, third call (replaces gpu_next_s6c.sh after s6b's finding: the skinny-matmul kernel
# made the 8B round slower end to end, 7.53 -> 7.90 ms at DDTree-64 with XLA's cache writes, while
# the one-kernel cache writes gained 0.65 ms): (1) the round table with XLA's dots and the Pallas
# cache writes, the verify pass alone beside each round (issue 6's overhead beyond the verify),
# DDTree-64 also with the int8 drafter; (2) issue 4's end-to-end before/after at prefix 8192
# (Pallas vs XLA attention, AR and DDTree-64). ~8 min.
# Usage (device tool): bash bench/sessions/gpu_next_s6d.sh -> $OUT/s6d.tar.xz
source bench/gpu_step.sh
step round_best 200 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 64,256 --rounds 32 --repeats 3 --stage-repeats 0 --verify-loop --matmul-impl xla --cache-impl pallas \
  --out "$R/round_best"
step int8 60 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-repeats 0 --matmul-impl xla --cache-impl pallas --drafter-quant int8 \
  --out "$R/int8"
step round8k 240 python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --attn-impl pallas,xla \
  --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --matmul-impl xla --cache-impl pallas \
  --out "$R/round8k"
finish s6d
