#!/usr/bin/env bash
# Prepared in session 7 (~8.5 min; after gpu_next_s8c.sh). (1) The rounds with the tree's
# selection barrier. (2) If s8b's (1) favours t2: t2's single prefix part at a long prefix,
# where one part per row block and head serialises the cache read (prefix 8192, DDTree-256,
# default vs t2, back to back). If t2 loses here, a table entry for it
# needs a cache-capacity bound (tuned_attention_config keys on T, G, head dim only).
# Usage (device tool): bash bench/sessions/gpu_next_s8d.sh -> $OUT/s8d.tar.xz
source bench/gpu_step.sh
# the DDTree-64 / 1024 rounds with the tree's selection barrier (compare the tree stage with session
# 7's stage-loop rows: 0.34 ms at 64, 0.62 at 1024)
step round_barrier 240 env DDTREE_SELECT_BARRIER=1 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
  --methods ddtree --budgets 64,1024 --rounds 16 --repeats 3 --stage-loop --out "$R/round_barrier"
cat > "$R/attn_t2.json" <<'EOT'
{"NVIDIA H200": [{"t": [257, 257], "g": 4, "dh": 128, "config": {"block_k": 64, "num_stages": 4, "num_splits": 1}}]}
EOT
step p8192_default 140 python3 -m bench.bench_round --model qwen3-8b --prompt-len 8192 --methods ddtree \
  --budgets 256 --rounds 16 --repeats 3 --stage-repeats 0 --verify-loop --out "$R/p8192_default"
step p8192_t2 140 env DDTREE_ATTENTION_TABLE="$R/attn_t2.json" python3 -m bench.bench_round --model qwen3-8b \
  --prompt-len 8192 --methods ddtree --budgets 256 --rounds 16 --repeats 3 --stage-repeats 0 --verify-loop \
  --out "$R/p8192_t2"
finish s8d
