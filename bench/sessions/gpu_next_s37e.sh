#!/usr/bin/env bash
# Session 37 (~4 min; the last of the device budget): s37d's TF32x3 products made the shipped
# pair's float32 DDTree-64 round 0.352 ms against 1.588 on IEEE float32. (1) Are float32 greedy
# outputs still token-identical to AR with it (AR's decode takes the same products)? (2) The
# float32 DDTree-64 round on XLA's attention, which s37d's row ran out of time for.
# Usage (device tool, carry bench/.device_commit and .data): BUDGET_S=230 bash bench/sessions/gpu_next_s37e.sh
source bench/gpu_step.sh
record_commit
step suite_tf32x3 150 env DDTREE_F32_ATTENTION_DOT=tf32x3 python3 -m bench --data .data/pystdlib-small.jsonl \
  --num-prompts 8 --max-new-tokens 128 --methods ar,dflash,ddtree --budgets 16,64 --policies ddtree --temperatures 0 \
  --repeats 3 --profile-prompts 0 --dtype float32 --compile-workers 4 --time-limit 140 --no-progress --out "$R/suite_tf32x3"
step f32_xla 70 python3 -m bench.bench_round --model shipped --prompt-len 256 --rounds 32 --repeats 3 --stage-repeats 0 \
  --dtype float32 --methods ddtree --budgets 64 --attn-impl xla --out "$R/f32_xla"
rm -f "$R"/*/*.png
finish s37e
