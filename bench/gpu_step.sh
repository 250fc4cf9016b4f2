# Sourced by the bench/gpu_*.sh device scripts from session 3 on.
# step NAME SECONDS CMD...: run CMD under a time limit, log to $R/NAME.log, line-buffered so that
# a killed step keeps what it printed.
step() {
  local name=$1 secs=$2; shift 2
  echo "=== $name ($(date +%T))"
  timeout "$secs" "$@" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" \
    | tee "$R/$name.log"
}
