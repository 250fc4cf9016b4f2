#!/usr/bin/env bash
# Prepared in session 9 for the next session's first call (~10 min).
# (1) bench_tree at small budgets: the sort branch (count-max 0) against the pairwise count
#     (8192) -- never timed below B = 256, where each depth's count + scatter + gathers are ~6
#     small kernels (launch-bound at B = 16-64) and XLA's sort of <= ~300 candidates may be one --
#     and the ancestor mask's two constructions at 129 slots (unmeasured; square is kept there);
#     then the one-hot selection (ddtree.SELECT_ONEHOT_MAX, built in session 9, untimed) at n * P
#     up to 20000 (B <= 64) and 100000 (B <= 128). A winner needs a round A/B before it ships.
# (2) DDTree-64 / 128 rounds, chain then square (session 9 ran square first and had chain 0.09 ms
#     slower at 64 while bench_tree had it 0.003 faster; this re-run swaps the order).
# (3) Profiles of DDTree-64 with the default attention plan and with 4 prefix parts at T = 65
#     (session 9: 4 parts +0.04 ms a round, though they give 200 programs instead of 120): the
#     attention and merge kernels' own times settle whether the merge eats the gain.
# Usage (device tool): bash bench/sessions/gpu_next_s10a.sh -> $OUT/s10a.tar.xz
source bench/gpu_step.sh
git log -1 --format=%H > "$R/commit.txt" 2>/dev/null
step tree 110 python3 -m bench.bench_tree --budgets 16,64,128,256 --count-max 0,8192 --ancestor-impl square,chain \
  --out "$R/tree"
step onehot 80 python3 -m bench.bench_tree --budgets 16,64,128 --count-max 8192 --onehot-max 0,20000,100000 \
  --out "$R/onehot"
for a in chain square; do
  step "rnd_$a" 120 env DDTREE_ANCESTOR_IMPL=$a python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 \
    --methods ddtree --budgets 64,128 --rounds 32 --repeats 3 --stage-repeats 0 --out "$R/rnd_$a"
done
echo '{"NVIDIA H200": [{"t": [65, 65], "g": 4, "dh": 128, "config": {"num_splits": 4}}]}' > "$R/split4.json"
step prof64 90 python3 -m bench.profile_round --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 \
  --out "$R/prof64"
step prof64_split4 90 env DDTREE_ATTENTION_TABLE="$R/split4.json" python3 -m bench.profile_round --model qwen3-8b \
  --prompt-len 512 --methods ddtree:64 --rounds 32 --out "$R/prof64_split4"
rm -f "$R"/prof64*/hlo_*.txt.xz   # 0.1 MB each; the kernel tables are what is wanted
finish s10a
