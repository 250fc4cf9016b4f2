#!/usr/bin/env bash
# Prepared in session 22 for the next session (~8 min; one call). Session 22 found that every
# profile_round figure so far ran op by op: XLA turns command buffers off while a profiler session
# is active unless xla_enable_command_buffers_during_profiling=true. So the ~0.3 ms a round that
# the profiles show between the loop predicate's MemcpyD2H and the next round's first kernel, and
# the ~5 us gap after each gate_up memset, may not be there in an unprofiled (graph) run.
# (1) Are the command buffers re-recorded every round? VLOG(3) of command_buffer_thunk counts
#     executions and updates ("Update command buffer ... updated_allocs=N") over an 8-round call.
# (2) A profile with the graphs on (profile_round --graphs; CUPTI traces the graphs' kernels): where
#     the idle really is. Compare with s22d's op-by-op prof_base.
# (3) The XLA command-buffer options that target update and launch cost, interleaved with the
#     default: update mode SKIP_TEMP (fixed VMM addresses for temporaries), graphs from 1 op,
#     CONCURRENT_REGIONS scheduling. An unknown flag fails its step at once (the XLA in JAX
#     0.11.2 may not have them all).
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s23a.sh
source bench/gpu_step.sh
record_commit
step vlog 90 bash -c 'env DDTREE_X=0 TF_CPP_VMODULE=command_buffer_thunk=3 TF_CPP_MIN_LOG_LEVEL=0 \
  python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 256 --rounds 8 \
  --repeats 1 --stage-repeats 0 --out "$0/vlog" 2> "$0/vlog.txt"
  f="$0/vlog.txt"
  echo "executions: $(grep -c "Execute command buffer" "$f")  updates: $(grep -c "Update command buffer" "$f")" \
    "initializations: $(grep -c "Initialized command buffer" "$f")"
  grep "Updated command buffer in" "$f" | sed "s/.*Updated/Updated/" | sort | uniq -c | sort -rn | head -8
  grep "Update command buffer" "$f" | sed "s/.*after/after/" | sort | uniq -c | sort -rn | head -8
  xz -T2 "$f"' "$R"
step prof_graph 80 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --graphs --out "$R/prof_graph"
export SECS=55
ddtree_rounds base1 ddtree 256
ddtree_rounds skiptemp ddtree 256 XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP
ddtree_rounds minsize1 ddtree 256 XLA_FLAGS=--xla_gpu_graph_min_graph_size=1
ddtree_rounds concur ddtree 256 XLA_FLAGS=--xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS
ddtree_rounds base2 ddtree 256
# a call's fixed cost (a call minus 32 steady rounds: ~3.5 ms at DDTree-64) is where re-recorded
# graphs would show first: the update modes at DDTree-64 too
ddtree_rounds skiptemp64 ddtree 64 XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP
ddtree_rounds base64 ddtree 64
finish s23a
