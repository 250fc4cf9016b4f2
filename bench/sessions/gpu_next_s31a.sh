#!/usr/bin/env bash
# Prepared in session 30 for the next session (~4 min; one call): what a call costs beyond its
# rounds once the state's buffers are kept (session 30: DDTree-64 4.8-4.9 ms a 32-round call, AR
# 3.1, with no command-buffer update left). The command-buffer thunk logs one line a round with
# a microsecond timestamp (VLOG 3) and probe_call_fixed --log-calls prints each call's start and
# end on the same clock, without a profiler: read off the time from a call's start to its first
# round's launch (dispatch), between launches (a round), and from the last launch to the end.
# Then the batch-2 check prepared in session 29 (gpu_next_s30b.sh, not run in session 30).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s31a.sh
source bench/gpu_step.sh
record_commit
for b in 64 0; do
  m=ddtree; [ "$b" = 0 ] && m=ar
  step "calls_$m$b" 110 env TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3,while_thunk=3 \
    python3 -m bench.probe_call_fixed --model qwen3-8b --method "$m" --budget "$b" --modes state,continue \
    --repeats 4 --log-calls --out "$R/calls_$m$b" > /dev/null
  grep "probe_call_fixed\]" "$R/calls_$m$b.log" | grep -v " call " || true
  python3 -m bench.call_phases "$R/calls_$m$b.log" --json "$R/calls_$m$b/phases.json" || true
done
# bench_round's calls (kept buffers): does any round-graph update remain outside the probe? (s30f's
# traced call still showed one under the profiler)
export SECS=65 ROUNDS=32 PROMPT=512
ddtree_rounds d64_vlog ddtree 64 TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 > /dev/null
grep "bench_round\] P=" "$R/d64_vlog.log" || true
grep -o "Updated command buffer in [0-9]* .s; num_commands=[0-9]*" "$R/d64_vlog.log" | tail -40
C3="DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc3,64x3w2so"
export SECS=75 ROUNDS=32 PROMPT=2048
SECS=95 ddtree_rounds b2p2048_tri ddtree 64 --batch 2
ddtree_rounds b2p2048_c3 ddtree 64 $C3 --batch 2
finish s31a
