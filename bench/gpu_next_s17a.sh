#!/usr/bin/env bash
# Prepared in session 16 for the next session (~8 min): the drafter's o and down products at 16
# rows inside the split-K-1 round executables (DDTree-32..64). There XLA runs them as cuBLAS
# split-K plus a ~2 us reduce kernel (s16c profile: o 11.0 + 2.0, down 26.3 + ~2 us a layer); the
# kernel alone took 11.4 / 27.4 us in session 7. (1) the products alone, XLA with and without the
# option against kernel configs; (2) DDTree-64 rounds with the shipped table plus candidate
# entries for o and down (xla_options) against the shipped table, interleaved. Keep an entry only
# if the rounds say so.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s17a.sh
source bench/gpu_step.sh
record_commit
F=xla_gpu_experimental_force_split_k=1
step gemm16 150 python3 -m bench.bench_gemm --rows 16 --shapes o,down --variants \
  xla,xla:$F,pallas,pallas:64x128x4x4x2x1x0,pallas:64x128x4x4x1x1x0,pallas:128x128x4x4x1x1x0,pallas:64x128x4x4x4x1x0 \
  --out "$R/gemm16"
# the int8 drafter's shapes since session 16's layout (its table entry was for the per-layer k/v)
step gemm16_int8 90 python3 -m bench.bench_gemm --rows 16 --shapes qkv_int8,ctx_kv_int8 --variants \
  xla,xla:$F,pallas,pallas:64x128x4x4x2x1x0,pallas:64x128x4x4x1x1x0 --out "$R/gemm16_int8"
python3 - "$R/cand.json" <<'PY'
import json, sys
from pallas_kernels import matmul as mm
table = json.loads(mm.TABLE_PATH.read_text())
opts = {"xla_gpu_experimental_force_split_k": 1}
table["NVIDIA H200"] += [
    {"k": 4096, "n": 4096, "rows": [16, 16], "config": [64, 128, 4, 4, 2, True, False], "shape": "o (the drafter's)",
     "xla_options": opts},
    {"k": 12288, "n": 4096, "rows": [16, 16], "config": [64, 128, 4, 4, 2, True, False], "shape": "down (the drafter's)",
     "xla_options": opts}]
json.dump(table, open(sys.argv[1], "w"), indent=1)
PY
SECS=100 ddtree_rounds cand_a ddtree 64 DDTREE_MATMUL_TABLE="$R/cand.json"
SECS=100 ddtree_rounds ship_a ddtree 64
SECS=100 ddtree_rounds cand_b ddtree 64 DDTREE_MATMUL_TABLE="$R/cand.json"
SECS=100 ddtree_rounds ship_b ddtree 64
finish s17a
