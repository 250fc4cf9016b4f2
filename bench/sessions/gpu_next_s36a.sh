#!/usr/bin/env bash
# Session 36 (~9 min; one call): session 35 left two questions about the stacked state.
# (1) Its 8B rows took longer on the GPU: bench_round's DDTree-64 row 56 s against the base's
#     37 s (s35a), and DDTree-256 printed no round within 80 s, twice, against the base's 49 s
#     (s35c). Session 35 found on the CPU that XLA compiled each layer's prompt write (a scatter
#     with the layer as a constant index) as a kernel of its own, and fixed it (03aebae: one
#     scatter a cache array). The rows' "[N s, at M s]" figures below are the test: new against
#     base, DDTree-256 and DDTree-64, with limits long enough to finish.
# (2) DDTree-256's rounds on the stacked state (not measured yet), and the dispatch probe
#     (s35a's printed nothing in 80 s).
# Usage (device tool, carry bench/.device_commit and bench/.ab_base; see gpu_next_s34a.sh for
# .ab_base): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s36a.sh
source bench/gpu_step.sh
record_commit
export ROUNDS=32 PROMPT=512
SECS=150 ddtree_rounds d256_a ddtree 256
SECS=110 base_rounds base256_a ddtree 256
SECS=90 ddtree_rounds d64_a ddtree 64
step dispatch 120 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
finish s36a
