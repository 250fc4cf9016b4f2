#!/usr/bin/env bash
# Session 12, fourth call (~3 min): DDTree-256 again, in the other order from s12_3: the 64-row
# tile with 64 new keys a step and the skip, the same without the skip, then the default (t2).
# Usage (device tool): bash bench/sessions/gpu_s12_4.sh -> $OUT/s12_4.tar.xz
source bench/gpu_step.sh
record_commit
ddtree_rounds m64_256 ddtree 256 DDTREE_ATTENTION_TABLE=bench/tables/t257_m64_b64_skip.json
ddtree_rounds m64k0_256 ddtree 256 DDTREE_ATTENTION_TABLE=bench/tables/t257_m64_b64_noskip.json
ddtree_rounds base256 ddtree 256
finish s12_4
