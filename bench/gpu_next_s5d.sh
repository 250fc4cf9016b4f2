#!/usr/bin/env bash
# Prepared in session 4 (not yet run): issue 6's (and 3's) 8B round table again, now that
# bench_round adds a stage's calls up per repeat (session 4's table took the median over a list
# that mixed the verify forward with the choose call, so its verify and beyond-verify columns are
# invalid) and no longer times its own state copy inside the commit stage.
# Usage (device tool): bash bench/gpu_next_s5d.sh -> $OUT/s5d.tar.xz   (~7.5 min; session 4's run of
# the same rows plus 63/255 took 432 s)
source bench/gpu_step.sh
step round 420 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 64,256,16,1024 --rounds 32 --repeats 3 --stage-repeats 2 --out "$R/round"
finish s5d
