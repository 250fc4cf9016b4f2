# Sourced by the bench/gpu_*.sh device scripts from session 3 on: the output folder $R (under
# $OUT, which the device tool brings back), `step` and `finish`.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R="$OUT/r"; mkdir -p "$R"

# step NAME SECONDS CMD...: run CMD under a time limit, log to $R/NAME.log, line-buffered so that
# a killed step keeps what it printed.
step() {
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" \
    | tee "$R/$name.log"
}

# finish NAME: $R as one archive, $OUT/NAME.tar.xz (at most 8 files come back from a call).
finish() {
  tar -C "$OUT" -cJf "$OUT/$1.tar.xz" r && rm -rf "$R"
  echo "=== done ($(date +%T))"
}
