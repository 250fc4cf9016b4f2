# Sourced by the bench/sessions/gpu_*.sh device scripts from session 3 on: the output folder
# $R (under $OUT, which the device tool brings back), `step` and `finish`.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
R="$OUT/r"; mkdir -p "$R"

# step NAME SECONDS CMD...: run CMD under a time limit, log to $R/NAME.log, line-buffered so that
# a killed step keeps what it printed.
# The whole script keeps within $BUDGET_S (570) seconds of sourcing this file, so that `finish`
# still runs inside the device tool's 600 s a call: a step gets at most what is left (less 15 s
# for the archive) and is skipped when under 20 s are left.
START_S=$(date +%s)
step() {
  local name=$1 secs=$2; shift 2
  local left=$(( START_S + ${BUDGET_S:-570} - 15 - $(date +%s) ))
  if [ "$left" -lt 20 ]; then echo "=== $name skipped: ${left} s left of the call"; return 0; fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "=== $name ($(date +%T), ${secs} s at most)"
  timeout "$secs" "$@" 2>&1 | grep --line-buffered -v "^WARNING\|^I0000\|^W0000\|DeprecationWarning\|st = dict" \
    | tee "$R/$name.log"
}

# finish NAME: $R as one archive, $OUT/NAME.tar.xz (at most 8 files come back from a call).
finish() {
  tar -C "$OUT" -cJf "$OUT/$1.tar.xz" r && rm -rf "$R"
  echo "=== done ($(date +%T))"
}

# ddtree_rounds NAME METHODS BUDGETS [NAME=VALUE...] [--bench_round-option...]: one bench_round run of the
# 8B-shaped pair (prompt $PROMPT (512), $ROUNDS rounds (32), 3 repeats, no stage loop, $SECS (110)
# s at most) under the given environment, with any further bench_round options (from the first
# argument that starts with --), as the A/B scripts interleave them (session 11 on).
ddtree_rounds() {
  local name=$1 methods=$2 budgets=$3; shift 3
  local envs=()
  while [ $# -gt 0 ] && [[ $1 != --* ]]; do envs+=("$1"); shift; done
  step "$name" "${SECS:-110}" env DDTREE_X=0 ${envs[@]+"${envs[@]}"} python3 -m bench.bench_round --model qwen3-8b \
    --prompt-len "${PROMPT:-512}" --methods "$methods" --budgets "$budgets" --rounds "${ROUNDS:-32}" --repeats 3 \
    --stage-repeats 0 "$@" --out "$R/$name"
}

# record_commit: the tree's commit to $R/commit.txt. The device copy's git directory can be
# stale (sessions 9 and 11: commit.txt named an older commit), so where bench/.device_commit
# exists (ignored by git; write it with `git describe --always --dirty > bench/.device_commit`
# before the call and pass it in the device tool's carry) that file wins.
record_commit() {
  if [ -f bench/.device_commit ]; then cp bench/.device_commit "$R/commit.txt"
  else git log -1 --format=%H > "$R/commit.txt" 2>/dev/null; fi
}

# base_rounds NAME METHODS BUDGETS [env NAME=VALUE...]: ddtree_rounds with the code of a base
# tree, $AB_BASE (bench/.ab_base unless set; built here by `bench/ab_tree.sh BASE [DIR]` and
# passed in the device tool's carry), so a change and its base run on one machine start. A second
# base (session 41's bench/.ab_head) is `AB_BASE=bench/.ab_head base_rounds ...`.
base_rounds() {
  local name=$1 methods=$2 budgets=$3; shift 3
  step "$name" "${SECS:-110}" bash -c 'cd "$0" && exec env DDTREE_X=0 "$@"' "${AB_BASE:-bench/.ab_base}" "$@" \
    python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods "$methods" --budgets "$budgets" \
    --rounds "${ROUNDS:-32}" --repeats 3 --stage-repeats 0 --out "$R/$name"
}

# decode_tiles NAME PREFIX ROWS [SECS]: bench_kernels' T = 1 rows ROWS (comma-separated indices
# into its T = 1 tile list, in the order given; repeat them to interleave) over a PREFIX-key
# cache, device time in a chain with caches rotated (HBM-cold), no correctness / XLA / cuDNN rows
# (session 38's scripts ran this command by hand).
decode_tiles() {
  local name=$1 prefix=$2 rows=$3 secs=${4:-60}
  step "$name" "$secs" python3 bench/bench_kernels.py --ts 1 --tile-prefix "$prefix" --split-prefixes "" --no-table \
    --no-correctness --no-xla --no-cudnn --trace --sweep-rows "$rows" --budget-s $(( secs > 30 ? secs - 10 : secs )) \
    --out "$R/$name"
}
