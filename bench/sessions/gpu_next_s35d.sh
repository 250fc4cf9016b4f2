#!/usr/bin/env bash
# Session 35 (~2 min; the last of the device budget): s35c's lossless check failed in the
# checkpoint's dtype (2/4 prompts, DDTree-64 and -256 alike). float32 (new code), then the same
# bf16 check on the base code (per-layer caches, 9721902): a bug of the stacked state, or near-ties?
source bench/gpu_step.sh
record_commit
A="--num-prompts 4 --max-new-tokens 64 --methods ar,ddtree --budgets 64 \
  --policies ddtree --temperatures 0 --repeats 1 --profile-prompts 0 --time-limit 50"
step f32 60 python3 -m bench --data .data/pystdlib-small.jsonl $A --dtype float32 --out "$R/f32"
step base_bf16 60 bash -c "cd bench/.ab_base && python3 -m bench --ckpt ../../ddtree_jax/default_model --data ../../.data/pystdlib-small.jsonl $A --out $R/base_bf16"
finish s35d
