#!/usr/bin/env bash
# Device call: tree-build microbenchmark, then round profiles with the unrolled loop.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/r"
step() {  # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" | tee "$OUT/r/$name.log"
}
step tree 130 python3 -m bench.bench_tree --budgets 16,64,256,1024 --out "$OUT/r"
step profile 400 python3 -m bench.profile_round --model qwen3-8b --methods ar/1,ar/4,ddtree:64/4,dflash/4,ddtree:256/4 --rounds 8 --out "$OUT/r"
tar -C "$OUT" -cJf "$OUT/call2.tar.xz" r && rm -rf "$OUT/r"
echo "=== done ($(date +%T))"
