#!/usr/bin/env bash
# Session 9, third call (~8 min). (1) Prefix parts of the tree-verify attention at T = 65 (and
# T = 16-17: the drafter's block and DDTree-16's verify). At prefix 512 the default plan gives
# T = 65 40 programs (5 row blocks x 8 kv heads) on 132 SMs; the 32-round caches (2816) get two
# prefix parts + the merge, a ~1024-position cache one part (s7e: one part 0.15 ms a round
# slower). Each trial is a $DDTREE_ATTENTION_TABLE (replacing the shipped one, whose only entry
# is T = 257) against the default row of this call. (2) Where DDTree-1024's tree stage goes: a
# profile of its round (session 8: build 0.62 ms alone; target 0.3).
# Usage (device tool): bash bench/sessions/gpu_s9_3.sh -> $OUT/s93.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
e() { echo "{\"t\": [$1, $2], \"g\": 4, \"dh\": 128, \"config\": {\"num_splits\": $3}}"; }
echo "{\"NVIDIA H200\": [$(e 65 65 4)]}" > "$R/split4.json"
echo "{\"NVIDIA H200\": [$(e 65 65 8)]}" > "$R/split8.json"
echo "{\"NVIDIA H200\": [$(e 16 17 4), $(e 65 65 4)]}" > "$R/split4_16.json"
rnd() {  # rnd NAME SECONDS [env...]
  local name=$1 secs=$2; shift 2
  step "$name" "$secs" env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 16,64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base 110 DDTREE_X=0
rnd split4 110 DDTREE_ATTENTION_TABLE="$R/split4.json"
rnd split8 110 DDTREE_ATTENTION_TABLE="$R/split8.json"
rnd split4_16 110 DDTREE_ATTENTION_TABLE="$R/split4_16.json"
step prof1024 130 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:1024 \
  --rounds 8 --out "$R/prof1024"
finish s93
