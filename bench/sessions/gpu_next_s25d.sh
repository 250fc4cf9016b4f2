#!/usr/bin/env bash
# Session 25, call d (~4 min; BUDGET_S 215: the session's last device seconds). s25c: XLA's
# GEMMs at 264 rows cost 8.2 us a layer more than at 256 (gate_up 79.5 against 74.1), and the
# verify attention at T = 256 fits one wave (64x4w2ks 11.8 us against 16.8 at 264). So a tree
# of 255 nodes (256 verify rows) should round ~0.5 ms faster than 256 (257 rows). DDTree-255
# with T = 256 on Triton (the default range starts at 257), on the Mosaic GPU kernel's default
# config and on its one-wave config, against DDTree-256.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s25d.sh
export BUDGET_S=215
source bench/gpu_step.sh
record_commit
export SECS=50 ROUNDS=32
ddtree_rounds d256 ddtree 256
ddtree_rounds d255_onewave ddtree 255 DDTREE_MGPU_ATTENTION=256-1032 DDTREE_MGPU_CONFIG=256:64x4w2ks,64x3w2so
ddtree_rounds d255_triton ddtree 255
ddtree_rounds d255_default ddtree 255 DDTREE_MGPU_ATTENTION=256-1032
finish s25d
