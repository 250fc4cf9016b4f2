#!/usr/bin/env bash
# Session 18, call 2 (~9 min): DDTree-64 and DDTree-256 rounds of this tree (pair_select on from
# 100 candidates with 16x32 tiles, runs_select from 1000 entries) against the base (bench/.ab_base
# = session 17's c81f800), interleaved, on one machine start.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_s18_2.sh
source bench/gpu_step.sh
record_commit
SECS=125 ddtree_rounds new_a ddtree 64,256
SECS=125 base_rounds base_a ddtree 64,256
SECS=125 ddtree_rounds new_b ddtree 64,256
SECS=125 base_rounds base_b ddtree 64,256
finish s182
