#!/usr/bin/env bash
# Prepared in session 5, not yet run. (1) Issue 4's end-to-end before/after at prefix 8192 (AR
# and DDTree-64, Pallas vs XLA attention), lost in session 4 to the one-piece 8192-token prefill
# (fixed by the chunked prefill, cef42ff); (2) where DDTree-64's round goes now, per kernel kind
# (session 2's profile predates the norm, attention and matmul kernels). ~8 min; the third
# call, for when >= 10 minutes of device time are left after s6a and s6b.
# Usage (device tool): bash bench/gpu_next_s6c.sh -> $OUT/s6c.tar.xz
source bench/gpu_step.sh
step round8k 330 python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --attn-impl pallas,xla \
  --methods ar,ddtree --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/round8k"
step profile 150 python3 -m bench.profile_round --model qwen3-8b --methods ar,ddtree:64 --rounds 16 \
  --matmul-impl auto --cache-impl pallas --out "$R/profile"
finish s6c
