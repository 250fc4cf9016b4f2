#!/usr/bin/env bash
# The next device call, prepared in session 2 (not yet run): does turning XLA's command buffers
# off for our executables remove the per-iteration device idle of the round loop (bench/RESULTS.md,
# "tree build and the unrolled loop")? Then the tree build with pairwise ranking up to 8192.
# Usage (device tool, carry [".data"]): bash bench/gpu_next.sh   -> $OUT/next.tar.xz
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R="$OUT/r"; mkdir -p "$R"
step() {  # step NAME SECONDS CMD...  (line-buffered, so a killed step keeps what it printed)
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" \
    | tee "$R/$name.log"
}
step cmdbuf_off 240 python3 -m bench.profile_round --model qwen3-8b --methods ar/1,ddtree:64/1,ar/4 --rounds 24 \
  --xla-option xla_gpu_enable_command_buffer= --out "$R/off"
step cmdbuf_on 150 python3 -m bench.profile_round --model qwen3-8b --methods ar/1,ddtree:64/1 --rounds 24 --out "$R/on"
# the tree build with the two-stage top-k (now the GPU default), and pairwise ranking up to 8192
step tree 110 python3 -m bench.bench_tree --budgets 64,256,1024 --count-max 1024,8192,0 --out "$R"
rm -f "$R"/*/hlo_*.txt.xz
tar -C "$OUT" -cJf "$OUT/next.tar.xz" r && rm -rf "$R"
echo "=== done ($(date +%T))"
