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
#     default: update modes SKIP_PROFILED / SKIP_TEMP (fixed VMM addresses), graphs from 1 op,
#     CONCURRENT_REGIONS scheduling. An unknown flag fails its step at once (the XLA in JAX
#     0.11.2 may not have them all).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s23a.sh
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
# A call costs more than its rounds: (a call's ms - steady ms) x 32 rounds = ~15 ms at DDTree-256
# and ~3.5 ms at DDTree-64 (s22d). Each call's state is new buffers (donated), so every graph
# that touches it is updated on the call's first iteration, and cuBLAS's traced captures are
# redone for new addresses (XLA's trace cache). SKIP_PROFILED gives the stable arguments fixed
# virtual addresses (VMM), SKIP_TEMP only the temporaries. In order of priority (steps that no
# longer fit are skipped):
export SECS=55
ddtree_rounds base1 ddtree 256
ddtree_rounds skipprof ddtree 256 XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_PROFILED
ddtree_rounds skiptemp ddtree 256 XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_TEMP
ddtree_rounds base64 ddtree 64
ddtree_rounds skipprof64 ddtree 64 XLA_FLAGS=--xla_gpu_command_buffer_update_mode=SKIP_PROFILED
ddtree_rounds base2 ddtree 256
ddtree_rounds minsize1 ddtree 256 XLA_FLAGS=--xla_gpu_graph_min_graph_size=1
ddtree_rounds concur ddtree 256 XLA_FLAGS=--xla_gpu_command_buffer_scheduling_mode=CONCURRENT_REGIONS
finish s23a
