#!/usr/bin/env bash
# Session 8, second call (~8 min). The new defaults (tree: selection barrier + Pallas first stage
# where a chunk keeps <= 64; attention: t2 at T = 257 for caches <= 4096) as a round; XLA's Triton
# GEMMs without split-K (--xla_gpu_experimental_force_split_k; the split-K autotuning flag is gone
# from JAX 0.11.2's XLA); t2 without its capacity bound at prefix 8192 against the default there;
# one T = 65 tile (t2's fields) against the default.
# Usage (device tool): bash bench/sessions/gpu_s8_2.sh -> $OUT/s82.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
rnd() {  # rnd NAME SECONDS METHODS BUDGETS PROMPT ROUNDS [env...]
  local name=$1 secs=$2 methods=$3 budgets=$4 prompt=$5 rounds=$6; shift 6
  step "$name" "$secs" env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len "$prompt" \
    --methods "$methods" --budgets "$budgets" --rounds "$rounds" --repeats 3 --stage-repeats 0 --out "$R/$name"
}
cat > "$R/attn_t2_any.json" <<'EOT'
{"NVIDIA H200": [{"t": [257, 257], "g": 4, "dh": 128, "config": {"block_k": 64, "num_stages": 4, "num_splits": 1}}]}
EOT
cat > "$R/attn_65.json" <<'EOT'
{"NVIDIA H200": [{"t": [65, 65], "g": 4, "dh": 128, "config": {"block_k": 64, "num_stages": 4, "num_splits": 1}}]}
EOT
rnd new 90 ddtree 64,256 512 32 DDTREE_X=0
rnd fsk1 120 ar,ddtree 64,256 512 32 XLA_FLAGS=--xla_gpu_experimental_force_split_k=1
rnd fsk2 60 ddtree 64 512 32 XLA_FLAGS=--xla_gpu_experimental_force_split_k=2
rnd a65 60 ddtree 64 512 32 DDTREE_ATTENTION_TABLE="$R/attn_65.json"
rnd p8192_default 80 ddtree 256 8192 16 DDTREE_X=0
rnd p8192_t2 80 ddtree 256 8192 16 DDTREE_ATTENTION_TABLE="$R/attn_t2_any.json"
finish s82
