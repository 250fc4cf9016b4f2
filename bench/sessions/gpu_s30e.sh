#!/usr/bin/env bash
# Session 30 (~8 min; one call): generate now prefills each request into the last request's
# state (engine.prefill_into), so the rounds' command buffers keep their addresses (s30d: the
# update was 3.5-5.3 ms a call with new buffers, none with them kept). bench_round times it the
# same way by default; --fresh-buffers is the old way. DDTree-64 ABAB, then DDTree-256 and AR.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s30e.sh
source bench/gpu_step.sh
record_commit
export SECS=65 ROUNDS=32 PROMPT=512
SECS=90 ddtree_rounds d64_kept1 ddtree 64
ddtree_rounds d64_fresh1 ddtree 64 --fresh-buffers
ddtree_rounds d64_kept2 ddtree 64
ddtree_rounds d64_fresh2 ddtree 64 --fresh-buffers
SECS=70 ddtree_rounds d256_kept ddtree 256
SECS=50 ddtree_rounds ar_kept ar 0
SECS=50 ddtree_rounds ar_fresh ar 0 --fresh-buffers
finish s30e
