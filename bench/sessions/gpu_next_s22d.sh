#!/usr/bin/env bash
# Ran in session 22 (bench/RESULTS.md "Session 22"). $DDTREE_GATE_UP existed in commits b8c8840-65ed021
# only: the layouts lost (AR +0.29 ms, DDTree-64 +0.10, DDTree-256 a tie) and the knob was removed.
# Session 22, after s22c: gate and up as two GEMMs ($DDTREE_GATE_UP=pair) took the memset and its
# gap away (s22c profiles: busy 8.719 ms against 8.858-8.861 fused, gaps under 5 us 0.22 against
# 0.38-0.40), but one run of each was within the machine's run-to-run noise (+-0.2 ms). Here:
# DDTree-256 fused / pair interleaved three times, then what the layout costs where rows are few
# (AR: two GEMVs a layer instead of one) and DDTree-64, then a profile of the fused default on the
# same machine start.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s22d.sh
source bench/gpu_step.sh
record_commit
export SECS=55
for i in 1 2 3; do
  ddtree_rounds "base256_$i" ddtree 256
  ddtree_rounds "pair256_$i" ddtree 256 DDTREE_GATE_UP=pair
done
ddtree_rounds ar_base ar 0
ddtree_rounds ar_pair ar 0 DDTREE_GATE_UP=pair
ddtree_rounds base64 ddtree 64
ddtree_rounds pair64 ddtree 64 DDTREE_GATE_UP=pair
step prof_base 70 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:256 \
  --rounds 16 --out "$R/prof_base"
finish s22d
