#!/usr/bin/env bash
# Prepared in session 22 for the next session (~7 min; one call). At 264 verify rows XLA computes
# the o and down products as split-K 2 (cuBLASLt f32[2, 264, 4096]) and sums the partials in a
# reduce kernel of its own (2.6 us, 72 a round), then the add + norm kernel reads the sum.
# $DDTREE_SPLIT_K=257-264:2 makes the split explicit (layers.linear_partials) and the add + norm
# kernel sums the partials as it loads them: 72 kernels and their gaps fewer a round, against a
# norm kernel that reads 8.4 MB of float32 partials instead of 2.1 MB (L2-resident after the GEMM).
# Expected: -0.1 to -0.2 ms a DDTree-256 round, if XLA picks the same GEMM for the explicit
# batched dot. Interleaved twice, then a graph-mode profile of the knob (did the reduce go, which
# GEMM did XLA pick?).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s23c.sh
source bench/gpu_step.sh
record_commit
export SECS=55
ddtree_rounds split1 ddtree 256 DDTREE_SPLIT_K=257-264:2
ddtree_rounds base1 ddtree 256
ddtree_rounds split2 ddtree 256 DDTREE_SPLIT_K=257-264:2
ddtree_rounds base2 ddtree 256
step prof_split 80 env DDTREE_SPLIT_K=257-264:2 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 \
  --methods ddtree:256 --rounds 16 --graphs --out "$R/prof_split"
# the same at batch 2 (528 verify rows: does XLA split there too?)
ddtree_rounds b2_split ddtree 256 DDTREE_SPLIT_K=521-528:2 --batch 2
ddtree_rounds b2_base ddtree 256 --batch 2
finish s23c
