#!/usr/bin/env bash
# Session 18, call 1 (~6 min): pair_select (a depth's selection by binary searches of the two
# sorted lists, in place of rank_select's pairwise count and XLA's candidate gathers) and
# runs_select (the final selection by binary searches of the depths' sorted beams).
# (1) check_tree at B = 256 / 1024 (the settings, runs_select from 1000 entries among them, and
# every depth in pair_select); (2) the build by device time at B = 256 / 1024, pair_select off / on
# x runs_select off / on, then B = 64 / 128 / 512 with pair_select off / on; (3) pair_select's
# tiles at B = 1024.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_s18_1.sh
source bench/gpu_step.sh
record_commit
step check 110 python3 -m bench.check_tree --budgets 256,1024 --no-beam-kernel --no-rank-kernel
step pair 150 python3 -m bench.bench_tree --budgets 256,1024 --count-max 8192 --pair-kernel-from 0,1 \
  --runs-kernel-from 0,1 --repeats 3 --trace --out "$R/pair"
step small 100 python3 -m bench.bench_tree --budgets 64,128,512 --count-max 8192 --pair-kernel-from 0,1 \
  --repeats 3 --trace --out "$R/small"
step tiles 100 python3 -m bench.bench_tree --budgets 1024 --count-max 8192 --pair-kernel-from 1 \
  --pair-kernel-tile 16x32w4,64x32w4,32x16w4,32x64w4,32x32w2,32x32w8 --repeats 3 --trace --out "$R/tiles"
finish s181
