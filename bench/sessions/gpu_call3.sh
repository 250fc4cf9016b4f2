#!/usr/bin/env bash
# Device call: the benchmark suite on the shipped pair (issue 6), then round profiles with XLA
# command buffers off vs on (issue 2/3 launch overhead). Everything lands in $OUT/call3.tar.xz.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R="$OUT/r"; mkdir -p "$R"
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" | tee "$R/$name.log"
}
JAX_DEFAULT_MATMUL_PRECISION=highest step suite 390 python3 -m bench --num-prompts 32 --prompt-tokens 256 \
  --max-new-tokens 256 --budgets 16,64,256 --policies ddtree,beam:width=4 --temperatures 0,1.0 --repeats 2 \
  --dtype float32 --torch-baseline --torch-repeats 1 --profile-prompts 2 --no-progress --out "$R/suite"
step cmdbuf_off 110 python3 -m bench.profile_round --model qwen3-8b --methods ar/1,ddtree:64/1,ar/4 --rounds 24 \
  --xla-option xla_gpu_enable_command_buffer= --out "$R/off"
step cmdbuf_on 50 python3 -m bench.profile_round --model qwen3-8b --methods ar/1 --rounds 24 --out "$R/on"
rm -f "$R"/*/hlo_*.txt.xz
tar -C "$OUT" -cJf "$OUT/call3.tar.xz" r && rm -rf "$R"
echo "=== done ($(date +%T))"
