#!/usr/bin/env bash
# Session 34 (~9 min; one call): session 34's stacked caches (models.layers.KVCache: every layer's
# K and V in one [L, Bt, Hkv, S, Dh] array each; the attention kernels (Triton and Mosaic GPU)
# and the cache write take the layer as an int32 input) and stacked norm weights
# (models.layers.stack_norms; the norm kernels and the matmul's rmsnorm prologue take the layer)
# on the GPU for the first time.
# (1) check_gpu --impl auto: every kernel "auto" picks, over stacked caches and norms, against XLA.
# (2) The shipped pair, greedy, token by token against AR (python -m bench; DDTree-64 / 256).
# (3) The dispatch probe: a call's argument handling with 2 cache leaves a model and ~170 fewer
#     weight leaves (s33c: the state's 91 leaves 1.04 ms, the weights' 338 0.91 ms, a 0-round
#     call 2.32 ms).
# (4) DDTree-64 against the base (per-layer caches and norms, 9721902) on this start.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): first
#   bench/ab_tree.sh 9721902
# then: bash bench/sessions/gpu_next_s34a.sh
source bench/gpu_step.sh
record_commit
step check 130 python3 -m bench.check_gpu --impl auto --layers 2
step lossless 110 python3 -m bench --num-prompts 4 --max-new-tokens 64 --methods ar,ddtree --budgets 64,256 \
  --policies ddtree --temperatures 0 --repeats 1 --profile-prompts 0 --time-limit 100 --out "$R/lossless"
step dispatch 90 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
export SECS=80 ROUNDS=32 PROMPT=512
ddtree_rounds d64_a ddtree 64
SECS=80 base_rounds base64_a ddtree 64
finish s34a
