#!/usr/bin/env bash
# Session 19, call 3 (~5 min): with the tree mask folded outside the jitted kernel call (one
# folding fusion a forward, not one a layer), DDTree-64 / 128 / 256 rounds with "auto" taking the
# Mosaic GPU kernel (s19_2's fastest configs: T = 72 64x4w2k, 264 64x3w2; 136 64x4w2k, unmeasured
# alone) against without, on one start.
source bench/gpu_step.sh
record_commit
SECS=150 ddtree_rounds on ddtree 64,128,256 DDTREE_MGPU_ATTENTION=8-1100 DDTREE_MGPU_CONFIG=72:64x4w2k,136:64x4w2k,264:64x3w2
SECS=130 ddtree_rounds off ddtree 64,128,256 DDTREE_MGPU_ATTENTION=off
finish s19_3
