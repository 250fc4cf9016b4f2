#!/usr/bin/env bash
# Session 35 (~6 min; one call, the rest of the device budget after s35a): the shipped pair,
# greedy, token by token against AR (s35a's step looked for the corpus under ../shared, which the
# device copy lacks: here it is carried in .data), then DDTree-256 rounds against the base
# (per-layer caches and norms, 9721902), interleaved.
# Usage (device tool, carry bench/.device_commit, bench/.ab_base and .data): first make
# .data/pystdlib-small.jsonl, the first 8 eval-split files of the corpus longer than 3000
# characters (the corpus itself would take the tree past the tool's 64 MiB), e.g.
#   mkdir -p .data && xz -dc ../shared/data/pystdlib-3.11.7.jsonl.xz | python3 -c 'import sys, json
#   rows = [l for l in sys.stdin if (r := json.loads(l))["split"] == "eval" and len(r["text"]) > 3000]
#   sys.stdout.writelines(rows[:8])' > .data/pystdlib-small.jsonl
# and add /.data/ to .git/info/exclude; then BUDGET_S=<limit less ~30> bash bench/sessions/gpu_next_s35c.sh
source bench/gpu_step.sh
record_commit
step lossless 100 python3 -m bench --data .data/pystdlib-small.jsonl --num-prompts 4 --max-new-tokens 64 \
  --methods ar,ddtree --budgets 64,256 --policies ddtree --temperatures 0 --repeats 1 --profile-prompts 0 \
  --time-limit 90 --out "$R/lossless"
export SECS=80 ROUNDS=32 PROMPT=512
ddtree_rounds d256_a ddtree 256
SECS=80 base_rounds base256_a ddtree 256
ddtree_rounds d256_b ddtree 256
finish s35c
