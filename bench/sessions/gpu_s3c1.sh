#!/usr/bin/env bash
# Session 3, device call 1: (a) do XLA command buffers cause the round loop's per-iteration
# device idle (bench/RESULTS.md)? profile_round with them off vs on; (b) issue 4's end-to-end
# round, Pallas vs XLA attention, at prefix 8192. Usage: bash bench/sessions/gpu_s3c1.sh -> $OUT/s3c1.tar.xz
source bench/gpu_step.sh
step cmdbuf_off 190 python3 -m bench.profile_round --model qwen3-8b --methods ar/1,ddtree:64/1,ar/2 --rounds 24 \
  --xla-option xla_gpu_enable_command_buffer= --out "$R/off"
step cmdbuf_on 125 python3 -m bench.profile_round --model qwen3-8b --methods ar/1,ddtree:64/1 --rounds 24 --out "$R/on"
for impl in pallas xla; do
  step "e2e8k_${impl}" 135 python3 -m bench.profile_round --model qwen3-8b --methods ar,ddtree:64 --rounds 16 \
    --prompt-len 8192 --attn-impl "$impl" --out "$R/e2e8k_$impl"
done
rm -f "$R"/*/hlo_*.txt.xz
finish s3c1
