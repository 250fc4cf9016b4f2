#!/usr/bin/env bash
# Session 31, third call (~9 min): the rounds on the new defaults (DDTree-64's key shares merged by
# split_merge's kernel; the round limit's device scalar made once, Generator.rounds_limit), and
# the drafter's 16-token block on the Mosaic GPU kernel with its shares merged by that kernel
# (c8m; s28d: c8 with XLA's merge tied Triton in rounds).
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s31c.sh
source bench/gpu_step.sh
record_commit
step alone16 70 python3 -m bench.bench_mgpu --inner 8 --ts 16 --prefixes 512,4096 \
  --configs triton,64x4w2kc8,64x4w2kc8m --out "$R/alone16"
export SECS=65 ROUNDS=32 PROMPT=512
SECS=90 ddtree_rounds d64_a ddtree 64
ddtree_rounds ar ar 0
ddtree_rounds d64_b ddtree 64
SECS=80 ddtree_rounds d256 ddtree 256
# the drafter's block on c8m, only if it beats Triton alone at both prefixes
if python3 - "$R/alone16/mgpu.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
busy = {(r["prefix"], r["config"]): r["busy_us"] for r in rows}
wins = [busy[(p, "64x4w2kc8m")] < busy[(p, "triton")] for p in (512, 4096)]
print("c8m beats Triton alone at prefix 512, 4096:", wins)
sys.exit(0 if all(wins) else 1)
PY
then
  D="DDTREE_MGPU_ATTENTION=16-1032 DDTREE_MGPU_CONFIG=16:64x4w2kc8m,72:64x4w2kc3m,64x3w2so"
  export SECS=85 PROMPT=4096
  ddtree_rounds p4096_default ddtree 64
  ddtree_rounds p4096_c8m ddtree 64 $D
fi
finish s31c
