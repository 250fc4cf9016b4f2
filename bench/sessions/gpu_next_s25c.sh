#!/usr/bin/env bash
# Session 25, call c (~7 min; BUDGET_S 480, so that the session's device time lasts). The tree:
# cb19a21's defaults; base bench/.ab_base = 596e340 (carried, as in s25b).
# (1) XLA's GEMMs at 256 / 264 / 272 rows (the 8B layer products; how much the 257th token and
#     the padding cost) and as float32 split-K partials (2, 4) at those rows; (2) DDTree-256,
#     new defaults against base, two more interleaved pairs; (3) DDTree-64 on this start;
#     (4) the tree build's first stage with 4 and 8 warps (bench.probe_topk, unrun since session 18).
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_next_s25c.sh
export BUDGET_S=480
source bench/gpu_step.sh
record_commit
step gemm 120 python3 -m bench.bench_gemm --rows 256,264,272 --shapes qkv,o,gate_up,down \
  --variants xla,split:2,split:4 --trace all --reps 5 --budget-s 110 --out "$R/gemm"
export SECS=50 ROUNDS=32
for i in 3 4; do
  base_rounds base$i ddtree 256
  ddtree_rounds new$i ddtree 256
done
ddtree_rounds new64 ddtree 64
step topk 60 python3 -m bench.probe_topk --warps 4,8 --out "$R/topk"
finish s25c
