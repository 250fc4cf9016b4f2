#!/usr/bin/env bash
# Device call: the benchmark suite on the shipped pair (issue 6); corpus carried in .data/.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R="$OUT/r"; mkdir -p "$R"
echo "=== suite ($(date +%T))"
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 370 python3 -m bench --data .data/pystdlib-3.11.7.jsonl.xz \
  --num-prompts 32 --prompt-tokens 256 --max-new-tokens 256 --budgets 16,64,256 --policies ddtree,beam:width=4 \
  --temperatures 0,1.0 --repeats 2 --dtype float32 --torch-baseline --torch-repeats 1 --profile-prompts 2 \
  --no-progress --out "$R/suite" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000" | tee "$R/suite.log"
tar -C "$OUT" -cJf "$OUT/call4.tar.xz" r && rm -rf "$R"
echo "=== done ($(date +%T))"
