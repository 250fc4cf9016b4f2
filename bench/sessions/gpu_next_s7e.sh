#!/usr/bin/env bash
# Session 7, fourth call (~6 min): attention tiles end to end. The s7d profile put the verify's
# tree attention at 13.9 us a layer at T = 65 and 32 us at T = 257 (prefix 512), ~7-10x its
# FLOP/byte floor: 0.50 and 1.15 ms a round. Each trial is a $DDTREE_ATTENTION_TABLE with one
# T = 65 entry (moves the DDTree-64 round only) and one T = 257 entry (moves DDTree-256 only);
# baseline (no table): s7a, 6.674 / 10.289 ms steady.
# Usage (device tool): bash bench/sessions/gpu_next_s7e.sh -> $OUT/s7e.tar.xz
source bench/gpu_step.sh
trial() {  # trial NAME T65_CONFIG_JSON T257_CONFIG_JSON
  cat > "$R/$1.json" <<EOT
{"NVIDIA H200": [{"t": [65, 65], "g": 4, "dh": 128, "config": $2},
                 {"t": [257, 257], "g": 4, "dh": 128, "config": $3}]}
EOT
  step "$1" 95 env DDTREE_ATTENTION_TABLE="$R/$1.json" python3 -m bench.bench_round --model qwen3-8b \
    --prompt-len 512 --methods ddtree --budgets 64,256 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$1"
}
trial t1 '{"num_splits": 1}' '{"block_k": 64, "num_stages": 4}'
trial t2 '{"block_m": 32}' '{"block_k": 64, "num_stages": 4, "num_splits": 1}'
trial t3 '{"block_new": 64}' '{"block_m": 64, "block_k": 64, "num_warps": 4, "num_stages": 3}'
trial t4 '{"num_stages": 4, "num_splits": 1}' '{"block_new": 64}'
finish s7e
