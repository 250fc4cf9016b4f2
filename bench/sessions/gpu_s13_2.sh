#!/usr/bin/env bash
# Session 13, second call (~7 min): s13_1 again with the stream annotation switched on in XLA
# (--xla_gpu_experimental_stream_annotation=true; without it the annotated prefetch ran in line:
# no call-start in the HLO), and the probe's weights as one array per layer.
# Usage (device tool): bash bench/sessions/gpu_s13_2.sh -> $OUT/s13_2.tar.xz
source bench/gpu_step.sh
record_commit
SA=XLA_FLAGS=--xla_gpu_experimental_stream_annotation=true
step probe 200 env "$SA" python3 -m bench.probe_prefetch --layers 12 --inner 8 --out "$R/probe"
ddtree_rounds base64 ddtree 64 "$SA"
ddtree_rounds pf_o ddtree 64 "$SA" DDTREE_L2_PREFETCH=o
ddtree_rounds base64b ddtree 64 "$SA"
ddtree_rounds pf_ob ddtree 64 "$SA" DDTREE_L2_PREFETCH=o
finish s13_2
