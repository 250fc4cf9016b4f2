#!/usr/bin/env bash
# Prepared in session 2 (not yet run): issue 4's end-to-end round time with the Pallas kernel vs
# the XLA attention at prefix 512 and 8k. Usage (device tool): bash bench/gpu_next2.sh -> $OUT/next2.tar.xz
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R="$OUT/r"; mkdir -p "$R"
step() {
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" \
    | tee "$R/$name.log"
}
for impl in pallas xla; do
  step "e2e_${impl}" 280 python3 -m bench.profile_round --model qwen3-8b --methods ar,ddtree:64 --rounds 16 \
    --prompt-len 8192 --attn-impl "$impl" --out "$R/$impl"
done
rm -f "$R"/*/hlo_*.txt.xz
tar -C "$OUT" -cJf "$OUT/next2.tar.xz" r && rm -rf "$R"
echo "=== done ($(date +%T))"
