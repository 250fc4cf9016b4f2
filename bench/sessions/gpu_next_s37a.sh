#!/usr/bin/env bash
# Session 37 (~8.5 min; one call): (1) decode (T = 1) on 2 warps (session 36's tile sweep at a
# 4096-token prefix: 7.53 + 1.90 us against the default's 7.78 + 1.88, by device time) in AR
# rounds, interleaved with the default at prompt 4096 (DDTREE_ATTENTION_TABLE=bench/tables/t1_w2.json:
# the shipped table plus a T = 1 entry); an entry goes in only if rounds gain. (2) DDTree-255 on
# the stacked state (README's advice for a large tree; 9.15-9.20 a call in session 26, not rerun
# since) with DDTree-256 beside it. (3) The dispatch probe on the stacked state (s35a's printed
# nothing in 80 s, before 03aebae's compile fix).
# On an H100 the table holds only the T = 1 entry (the H100 ships no table), so there it is the
# 2-warp decode against the defaults too.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s37a.sh
source bench/gpu_step.sh
record_commit
export SECS=60 ROUNDS=32
PROMPT=4096 ddtree_rounds ar4k_a ar 0
PROMPT=4096 ddtree_rounds ar4k_w2 ar 0 DDTREE_ATTENTION_TABLE=bench/tables/t1_w2.json
PROMPT=4096 ddtree_rounds ar4k_b ar 0
PROMPT=4096 ddtree_rounds ar4k_w2b ar 0 DDTREE_ATTENTION_TABLE=bench/tables/t1_w2.json
SECS=70 PROMPT=512 ddtree_rounds d255 ddtree 255
SECS=70 PROMPT=512 ddtree_rounds d256 ddtree 256
step dispatch 110 python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes state --repeats 4 \
  --dispatch --out "$R/dispatch"
finish s37a
