#!/usr/bin/env bash
# Session 13, first call (~9 min): can the verify layer's latency-bound kernels hide a read of
# the next products' weights into L2? (1) bench/probe_prefetch.py: the o product cold vs L2-warm,
# and [attention -> o / down] chains with the weight read on a second stream; (2) DDTree-64 rounds
# with DDTREE_L2_PREFETCH (ddtree_jax/models/layers.py) against the default, interleaved.
# Usage (device tool): bash bench/sessions/gpu_s13_1.sh -> $OUT/s13_1.tar.xz
source bench/gpu_step.sh
record_commit
step probe 240 python3 -m bench.probe_prefetch --layers 12 --inner 8 --out "$R/probe"
ddtree_rounds base64 ddtree 64
ddtree_rounds pf_o ddtree 64 DDTREE_L2_PREFETCH=o
ddtree_rounds pf_ogu ddtree 64 DDTREE_L2_PREFETCH=o,gate_up:0.06
ddtree_rounds base64b ddtree 64
ddtree_rounds pf_ob ddtree 64 DDTREE_L2_PREFETCH=o
finish s13_1
