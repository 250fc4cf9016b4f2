#!/usr/bin/env bash
# Prepared in session 21 for the next session (~9 min; one call). Session 21's DDTree-256 profile
# (s21c, bench/RESULTS.md "Session 21"): the steady round (9.51 ms) is 0.65 ms above the kernels'
# busy time (8.86). 0.38 ms of that are sub-5 us gaps between kernels, ~0.21 of them in front of
# every gate_up GEMM (cuBLASLt's algorithm 1 issues a `Memset 0`, and the GEMM starts 4.4-5.5 us
# after it). The other ~0.27 ms sit at the while loop's iteration boundary (XLA's while loop
# copies its predicate to the host every round).
# (1) The loop inside the command buffer (WHILE / CONDITIONAL commands: CUDA graph conditional
#     nodes, no host round trip a round), against the default, and the GEMMs outside the command
#     buffer (the memset then a stream memset, not a graph node), interleaved twice, DDTree-256.
#     Also 2 rounds a loop iteration (--unroll 2: half the boundaries; session 2 found unrolling
#     slower, but on 8-round calls and before the Pallas kernels).
# (2) A profile with (1)'s first variant: did the loop enter the graph, did the memset gap go?
# (3) DDTree-64 at prompt 4096, the Mosaic GPU kernel with key_splits 2 at T = 72 (s21b alone:
#     24.8 us against Triton's 29.4 over a 4096-token prefix) against the default (Triton).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s22a.sh
source bench/gpu_step.sh
record_commit
# XLA's default set is FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION: the variants add to / take from it
CBW="--xla-option xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,WHILE,CONDITIONAL"
NOGEMM="--xla-option xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION"
export SECS=60
# In order of what matters most: gpu_step.sh skips what no longer fits in the call.
ddtree_rounds cbw1 ddtree 256 $CBW
ddtree_rounds base1 ddtree 256
ddtree_rounds cbw2 ddtree 256 $CBW
ddtree_rounds base2 ddtree 256
step prof_cbw 80 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 $CBW --out "$R/prof_cbw"
ddtree_rounds nogemm1 ddtree 256 $NOGEMM
# XLA converts a while loop into the command buffer only if every thunk of its body is
# convertible: the same with the Triton kernel in place of the Mosaic GPU custom call.
ddtree_rounds cbw_tri ddtree 256 DDTREE_MGPU_ATTENTION=off $CBW
ddtree_rounds nogemm2 ddtree 256 $NOGEMM
SECS=90 ddtree_rounds unroll2 ddtree 256 --unroll 2
# DDTree-64 at prompt 4096
SECS=70 PROMPT=4096 ddtree_rounds p4k_ks2 ddtree 64 DDTREE_MGPU_ATTENTION=72-1032 DDTREE_MGPU_CONFIG=72:64x4w2kc2,64x3w2s
SECS=70 PROMPT=4096 ddtree_rounds p4k_tri ddtree 64
finish s22a
