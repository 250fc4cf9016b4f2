#!/usr/bin/env bash
# Prepared in session 31 (session 32 had no GPU) for the next session (~8 min; one call): session 31's last commits on the
# GPU. (1) check_gpu --impl auto: the model forward with the kernels "auto" picks against XLA,
# now with T = 16 over 5 keys (the drafter's block on a short prompt: 7 of c8m's 8 key shares
# empty). (2) The dispatch probe: a 0-round call without the per-call jnp.int32 (s31b: 2.833 ms
# with the limit made before, 3.883 inside). (3) Rounds: DDTree-64 twice and DFlash on the final
# defaults, and bench_round's new prefill_ms (prefill_into, as generate runs it).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s33a.sh
source bench/gpu_step.sh
record_commit
step check 150 python3 -m bench.check_gpu --impl auto --layers 2
step dispatch 100 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
export SECS=65 ROUNDS=32 PROMPT=512
SECS=90 ddtree_rounds d64_a ddtree 64
ddtree_rounds dflash dflash 0
ddtree_rounds d64_b ddtree 64
finish s33a
