#!/usr/bin/env bash
# Prepared in session 7 for the next session's second call (~8 min): the attention A/Bs that s7e
# left open, each pair back to back on one machine (s7e compared against s7a's default rows,
# measured on another machine start).
# The prefix-part count depends on the cache capacity, not only on the prefix: bench_round's
# 32-round rows (cache 2816 at B = 64, 3200 at 256) split a 512-token prefix into 2 parts + the
# merge kernel; an 8-round run (cache 1280, as profile_round and a typical generate call) keeps
# one part. s7e's t1 (one part at cache 2816) was 0.15 ms slower at B = 64 than s7a's default.
# (1) 32 rounds: DDTree-256, default vs t2 (128x64 tiles, 4 stages, one part);
# (2) 8 rounds: DDTree-64 and 256, default (one part) vs two parts (num_splits 2);
# (3) a profile of DDTree-64 with session 7's matmul table (o, down, drafter_kv in the kernel:
#     faster alone, no faster in the round): which kernels the round then runs, for how long.
# Usage (device tool): bash bench/sessions/gpu_next_s8b.sh -> $OUT/s8b.tar.xz
source bench/gpu_step.sh
cat > "$R/attn_t2.json" <<'EOT'
{"NVIDIA H200": [{"t": [257, 257], "g": 4, "dh": 128, "config": {"block_k": 64, "num_stages": 4, "num_splits": 1}}]}
EOT
cat > "$R/attn_split2.json" <<'EOT'
{"NVIDIA H200": [{"t": [65, 65], "g": 4, "dh": 128, "config": {"num_splits": 2}},
                 {"t": [257, 257], "g": 4, "dh": 128, "config": {"num_splits": 2}}]}
EOT
round() {  # round NAME TABLE|none ROUNDS BUDGETS SECONDS
  local name=$1 table=$2 rounds=$3 budgets=$4 secs=$5
  step "$name" "$secs" env DDTREE_ATTENTION_TABLE="$([ "$table" = none ] || echo "$R/$table")" python3 -m bench.bench_round \
    --model qwen3-8b --prompt-len 512 --methods ddtree --budgets "$budgets" --rounds "$rounds" --repeats 3 \
    --stage-repeats 0 --verify-loop --out "$R/$name"
}
round r32_default none 32 256 90
round r32_t2 attn_t2.json 32 256 90
round r8_default none 8 64,256 130
round r8_split2 attn_split2.json 8 64,256 130
step profile_table 120 env DDTREE_MATMUL_TABLE=bench/results/session7/s7a/matmul_configs.json \
  python3 -m bench.profile_round --model qwen3-8b --methods ddtree:64 --rounds 8 --matmul-impl auto --out "$R/profile_table"
finish s8b
