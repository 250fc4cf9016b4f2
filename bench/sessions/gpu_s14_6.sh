#!/usr/bin/env bash
# Session 14, call 6 (refused: no device time left; gpu_next_s15a.sh repeats it): the tree build's fast paths (threshold second stage, the one-kernel depth
# loop) give XLA's tree on the H200 (bench/check_tree.py).
# Usage (device tool): bash bench/sessions/gpu_s14_6.sh -> $OUT/s14_6.tar.xz
source bench/gpu_step.sh
record_commit
step check_tree 120 python3 -m bench.check_tree --budgets 16,64
finish s14_6
