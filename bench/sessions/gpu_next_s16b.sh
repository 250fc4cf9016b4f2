#!/usr/bin/env bash
# Session 16 (~13 min): this tree against its base (bench/.ab_base: 072b2c4, session 15's last
# commit) on one machine start, interleaved: DFlash and DDTree-16 / 64 / 256 rounds. The changes:
# the drafter's fused layout (one q/k/v product and one q/k-norm + RoPE kernel a layer; the commit's
# context k/v of all layers in one product, one norm fusion and one cache write), the cache write
# with a program per array (was 9 arrays a program), the final merge from 8192 entries (B = 1024
# only). Then the skinny products at 16 rows in and out of the split-K-1 executables (the drafter's
# qkv ran 21 us in DDTree-64's round against 15 us in DDTree-256's), and a DDTree-64 profile.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_next_s16b.sh
source bench/gpu_step.sh
record_commit
SECS=170 ddtree_rounds new_a dflash,ddtree 16,64,256
SECS=170 base_rounds base_a dflash,ddtree 16,64,256
SECS=170 ddtree_rounds new_b dflash,ddtree 16,64,256
SECS=170 base_rounds base_b dflash,ddtree 16,64,256
F=xla_gpu_experimental_force_split_k=1
step gemm16 150 python3 -m bench.bench_gemm --rows 16 --shapes qkv,ctx_kv,fc --variants \
  xla,xla:$F,pallas,pallas:64x128x4x4x2x1x0,pallas:64x128x4x4x1x1x0,pallas:128x128x4x4x1x1x0,pallas:64x128x4x4x4x1x0 \
  --out "$R/gemm16"
step prof64 150 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 \
  --out "$R/prof64"
finish s16b
