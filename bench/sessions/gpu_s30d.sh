#!/usr/bin/env bash
# Session 30 (~6 min; one call): what the first round of a call updates. s30c: XLA's
# SKIP_TEMP update mode (temps at fixed virtual addresses; the only VA mode jaxlib 0.11.2
# parses) did not lower the fixed cost. Here the command-buffer thunk's own log (VLOG 3:
# "Update command buffer ... updated_allocs=K", "Updated command buffer in T us") for each
# probe_call_fixed mode (fresh state, whole state donated, streaming on), default and SKIP_TEMP.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s30d.sh
source bench/gpu_step.sh
record_commit
V=--xla_gpu_command_buffer_update_mode=SKIP_TEMP
probe() {  # NAME [XLA_FLAGS]: the probe with the thunk's log, then its update lines in brief
  local name=$1 flags=${2:-}
  step "$name" 120 env TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 XLA_FLAGS="$flags" \
    python3 -m bench.probe_call_fixed --model qwen3-8b --budget 64 --modes fresh,state,continue --repeats 3 \
    --out "$R/$name" > /dev/null
  grep -v "Execute command buffer\|Executing warm up" "$R/$name.log" > "$R/$name.updates.log" || true
  grep -c "Updated command buffer in" "$R/$name.log" || true
  grep "probe_call_fixed\]\|Updated command buffer in\|updated_allocs" "$R/$name.log" | sed 's/^.*\] //' | cut -c1-200 | tail -60
}
probe d64_vlog
probe d64_vlog_skiptemp "$V"
finish s30d
