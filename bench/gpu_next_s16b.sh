#!/usr/bin/env bash
# Prepared in session 15 for the next session (~5 min): DDTree-1024 rounds with the select second
# stage (the default since session 15) against lax.top_k's sort (s15e's 75 s steps were too short
# for the 1024 compile); add DDTREE_FINAL_MERGE_FROM=1 rows if gpu_next_s16a.sh found it equal
# and faster.
# Usage (device tool): bash bench/gpu_next_s16b.sh -> $OUT/s16b.tar.xz
source bench/gpu_step.sh
record_commit
ROUNDS=16 SECS=140 ddtree_rounds sel_a ddtree 1024
ROUNDS=16 SECS=140 ddtree_rounds topk_a ddtree 1024 DDTREE_VOCAB_STAGE2_SELECT=0
finish s16b
