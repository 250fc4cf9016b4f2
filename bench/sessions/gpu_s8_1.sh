#!/usr/bin/env bash
# Session 8, first call (~9 min): the same-machine A/Bs with the largest expected gains.
# (1) rounds with XLA's defaults vs without its split-K autotuning (session 7's profile: o and
#     down at 65 rows run as split-K 8 Triton GEMMs + a reduce, 1.9-3.0 TB/s);
# (2) DDTree-256 with attention tile t2 (128x64, 4 stages, one prefix part) against (1)'s default;
# (3) the tree build alone with/without the selection barrier, XLA vs Pallas first stage.
# Usage (device tool): bash bench/sessions/gpu_s8_1.sh -> $OUT/s81.tar.xz
source bench/gpu_step.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,power.limit --format=csv > "$R/gpu.txt" 2>&1
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
rnd() {  # rnd NAME SECONDS BUDGETS [env...]
  local name=$1 secs=$2 methods=$3 budgets=$4; shift 4
  step "$name" "$secs" env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods "$methods" --budgets "$budgets" --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
cat > "$R/attn_t2.json" <<'EOT'
{"NVIDIA H200": [{"t": [257, 257], "g": 4, "dh": 128, "config": {"block_k": 64, "num_stages": 4, "num_splits": 1}}]}
EOT
rnd base 130 ar,ddtree 64,256 DDTREE_X=0
rnd no_splitk 150 ar,ddtree 64,256 XLA_FLAGS=--xla_gpu_enable_split_k_autotuning=false
rnd t2 75 ddtree 256 DDTREE_ATTENTION_TABLE="$R/attn_t2.json"
step tree 120 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --select-barrier 0,1 \
  --variants 128x64p,256x16p --out "$R/tree"
step tree_p 70 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 8192 --select-barrier 0,1 \
  --stage1 pallas --out "$R/tree_p"
finish s81
