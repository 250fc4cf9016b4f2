#!/usr/bin/env bash
# Prepared in session 14 for the next session (~8 min): (1) the tree build's fast paths give XLA's
# tree on the device (bench.check_tree: session 14's threshold second stage, shipped on timing
# alone, and the one-kernel depth loop); (2) DDTree-16/64 rounds with the threshold second stage
# (the default since session 14) interleaved with lax.top_k's (DDTREE_VOCAB_STAGE2_MAX_K=0).
# Usage (device tool): bash bench/sessions/gpu_next_s15a.sh -> $OUT/s15a.tar.xz
source bench/gpu_step.sh
record_commit
step check_tree 150 python3 -m bench.check_tree --budgets 16,64
ddtree_rounds s2_a ddtree 16,64
ddtree_rounds topk_a ddtree 16,64 DDTREE_VOCAB_STAGE2_MAX_K=0
ddtree_rounds s2_b ddtree 16,64
finish s15a
