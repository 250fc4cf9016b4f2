#!/usr/bin/env bash
# Session 37 (~5 min; one call): s37c found the shipped pair's float32 verify attention slow on
# the Triton kernel (DDTree-64: 2.78 ms of a 3.2 ms round over 4 layers; bf16 0.28 ms a round).
# (1) float32 rounds with the kernel against XLA's attention, (2) the kernel's float32 products
# on three TF32 passes ($DDTREE_F32_ATTENTION_DOT=tf32x3) instead of IEEE FMA, (3) the shipped
# pair's suite in its checkpoint dtype (bf16, as generate runs it on a GPU), greedy.
# Usage (device tool, carry bench/.device_commit and .data, made as gpu_next_s35c.sh's header
# says): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s37d.sh
source bench/gpu_step.sh
record_commit
A="--model shipped --prompt-len 256 --rounds 32 --repeats 3 --stage-repeats 0 --dtype float32"
step f32_impls 120 python3 -m bench.bench_round $A --methods dflash,ddtree --budgets 16,64 --attn-impl auto,xla --out "$R/f32_impls"
step f32_tf32x3 80 env DDTREE_F32_ATTENTION_DOT=tf32x3 python3 -m bench.bench_round $A --methods dflash,ddtree --budgets 16,64 \
  --out "$R/f32_tf32x3"
step suite_bf16 200 python3 -m bench --data .data/pystdlib-small.jsonl --num-prompts 8 --max-new-tokens 128 \
  --methods ar,dflash,ddtree --budgets 16,64 --policies ddtree --temperatures 0 --repeats 3 \
  --profile-prompts 0 --compile-workers 4 --time-limit 190 --no-progress --out "$R/suite_bf16"
rm -f "$R"/*/*.png
finish s37d
