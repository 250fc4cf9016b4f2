#!/usr/bin/env bash
# Session 19, call 4 (~3 min): what padding the verify to 72 rows costs by itself (Triton
# attention both times), DDTree-64: s19_3 had the Mosaic GPU kernel + padding 0.2 ms slower a round.
source bench/gpu_step.sh
record_commit
SECS=90 ddtree_rounds pad ddtree 64 DDTREE_MGPU_ATTENTION=off DDTREE_PAD_VERIFY=8
SECS=80 ddtree_rounds nopad ddtree 64 DDTREE_MGPU_ATTENTION=off
finish s19_4
