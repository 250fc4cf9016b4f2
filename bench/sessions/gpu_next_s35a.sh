#!/usr/bin/env bash
# Session 35 (~8 min; one call): gpu_next_s34a.sh reordered for a short device budget (session 35
# got one machine start in ~10 tries): session 34's stacked caches and norm weights on the GPU for
# the first time. (1) check_gpu --impl auto: every kernel "auto" picks, over stacked caches and
# norms, against XLA. (2) The shipped pair, greedy, token by token against AR (DDTree-64 / 256).
# (3) DDTree-64 rounds against the base (per-layer caches and norms, 9721902) on this start,
# interleaved new / base. (4) The dispatch probe (a call's argument handling) if time is left.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; see gpu_next_s34a.sh for
# .ab_base): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s35a.sh
source bench/gpu_step.sh
record_commit
step check 120 python3 -m bench.check_gpu --impl auto --layers 2
step lossless 100 python3 -m bench --num-prompts 4 --max-new-tokens 64 --methods ar,ddtree --budgets 64,256 \
  --policies ddtree --temperatures 0 --repeats 1 --profile-prompts 0 --time-limit 90 --out "$R/lossless"
export SECS=75 ROUNDS=32 PROMPT=512
ddtree_rounds d64_a ddtree 64
SECS=75 base_rounds base64_a ddtree 64
step dispatch 80 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
finish s35a
