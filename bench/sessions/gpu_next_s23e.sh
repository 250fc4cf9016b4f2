#!/usr/bin/env bash
# Session 23 (~5 min; one call). s23a's graph-mode profile: 0.40-0.49 ms idle every DDTree-256
# round between the loop predicate's device-to-host copy and the next round's first kernel (the
# host launching the next graph while the device waits). DDTREE_UNROLL_AS_LOOP=1 with --unroll K
# runs K rounds as an inner loop of known trip count: XLA's while thunk then skips the
# predicate's copy, so the host can launch round j+1 while the device runs round j (a round past
# the stop runs but commits nothing, as with the unrolled copies). Interleaved with the default.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s23e.sh
source bench/gpu_step.sh
record_commit
export SECS=45
ddtree_rounds loop4 ddtree 256 DDTREE_UNROLL_AS_LOOP=1 --unroll 4
ddtree_rounds base1 ddtree 256
ddtree_rounds loop4_64 ddtree 64 DDTREE_UNROLL_AS_LOOP=1 --unroll 4
ddtree_rounds base64 ddtree 64
step prof_loop4 75 env DDTREE_UNROLL_AS_LOOP=1 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 \
  --methods ddtree:256/4 --rounds 16 --graphs --out "$R/prof_loop4"
finish s23e
