#!/usr/bin/env bash
# Session 10 (~6 min): the attention kernel's in-kernel merge (KernelConfig.merge = "last", built
# this session) on the device. (1) bench/check_merge_last.py: both merges against the XLA
# reference, 100 bit-identical repeats of "last" (a program reading a partial before it was
# written would show here; a CPU run cannot), and each kernel's time in a chain, at T = 65 /
# 257 / 1 and prefixes 512 to 32k. (2) DDTree-64 rounds, default then "last" then again
# (interleaved, same call), "last" set for every T by a $DDTREE_ATTENTION_TABLE that keeps the
# shipped T = 257 entry first.
# Usage (device tool): bash bench/sessions/gpu_next_s10e.sh -> $OUT/s10e.tar.xz
source bench/gpu_step.sh
step check 150 python3 bench/check_merge_last.py --out "$R/check"
cat > "$R/last.json" <<'J'
{"NVIDIA H200": [{"t": [257, 257], "g": 4, "dh": 128, "s": [0, 3584],
                  "config": {"block_k": 64, "num_stages": 4, "num_splits": 1}},
                 {"t": [1, 2048], "g": 4, "dh": 128, "config": {"merge": "last"}}]}
J
rnd() {  # rnd NAME [env...]
  local name=$1; shift
  step "$name" 80 env "$@" python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree \
    --budgets 64 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/$name"
}
rnd base1 DDTREE_X=0
rnd last1 DDTREE_ATTENTION_TABLE="$R/last.json"
rnd base2 DDTREE_X=0
rnd last2 DDTREE_ATTENTION_TABLE="$R/last.json"
finish s10e
