#!/usr/bin/env bash
# Prepared in session 3 (not yet run): the rewritten attention kernel's table (issue 4: >= 80 % of
# the bytes floor at prefix >= 4k?), on-device parity, and the tree build alone (issue 3).
# Usage (device tool): bash bench/sessions/gpu_next_a.sh -> $OUT/next_a.tar.xz   (~8 min)
source bench/gpu_step.sh
step check 70 python3 -m bench.check_gpu
# session 3's 110 s step ended inside this script's split sweep before the table: give it room,
# table first (no tile sweep), then the split sweep at 4k
step kernels 300 python3 bench/bench_kernels.py --out "$R/kernels" --budget-s 270 --ts 1,65,257 \
  --prefixes 1024,4096,8192,16384,32768 --tile-prefix 0 --split-prefixes 4096 --splits 1,4,16,64 --no-cudnn
step tree 100 python3 -m bench.bench_tree --budgets 16,64,256,1024 --count-max 1024,8192,0 --out "$R"
finish next_a
