#!/usr/bin/env bash
# One device call: where the decode step and the round spend their time (see bench/RESULTS.md).
# Usage (device tool): bash bench/sessions/gpu_probe.sh   (writes logs and JSON under $OUT)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep -v "^WARNING\|^I0000\|^W0000" | tee "$OUT/$name.log"
}
step profile 300 python3 -m bench.profile_round --model qwen3-8b --methods ar,dflash,ddtree:64,ddtree:256,ddtree:1024 --rounds 8 --out "$OUT/prof"
step probe 100 python3 -m bench.probe_decode --out "$OUT/probe"
XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL" \
  step profile_cmdbuf 120 python3 -m bench.profile_round --model qwen3-8b --methods ar,ddtree:64 --rounds 8
step profile_xla 100 python3 -m bench.profile_round --model qwen3-8b --methods ar,ddtree:64 --rounds 8 --attn-impl xla
echo "=== done ($(date +%T))"
