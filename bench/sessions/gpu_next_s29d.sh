#!/usr/bin/env bash
# Session 29, fourth call (~6 min). key_splits' merge written share by share (no reduce over the
# shares), so that XLA can emit one loop fusion instead of two (s29b alone: the weights'
# exponential fusion 1.3 us and the weighted sum 2.2 us a layer). Alone (new tree, then the base
# in bench/.ab_base), launches and us a call: T = 72 on c3 at prefixes 512 / 4096, T = 264 on the
# tail split over 4096. Then DDTree-64 rounds at prompt 512, ABAB, the change against the base.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_next_s29d.sh
source bench/gpu_step.sh
record_commit
ALONE="python3 -m bench.bench_mgpu --inner 8"
step alone_new 80 $ALONE --ts 72 --prefixes 512,4096 --configs 64x4w2kc3 --out "$R/alone_new"
step alone_base 80 bash -c "cd bench/.ab_base && exec $ALONE --ts 72 --prefixes 512,4096 --configs 64x4w2kc3"
step tail_new 50 $ALONE --ts 264 --prefixes 4096 --configs 64x4w2kst8 --out "$R/tail_new"
step tail_base 50 bash -c "cd bench/.ab_base && exec $ALONE --ts 264 --prefixes 4096 --configs 64x4w2kst8"
export SECS=50
ddtree_rounds d64_new1 ddtree 64
base_rounds d64_base1 ddtree 64
ddtree_rounds d64_new2 ddtree 64
base_rounds d64_base2 ddtree 64
finish s29d
