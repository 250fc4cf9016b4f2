#!/usr/bin/env bash
# Session 29, fifth call (~5 min): s29d's DDTree-64 rounds again with more time (its 50 s ran
# out on a slow start): the merge share by share (this tree) against the base 5944c3a in
# bench/.ab_base, prompt 512, ABAB.
# Usage (device tool, carry bench/.device_commit and bench/.ab_base): bash bench/sessions/gpu_next_s29e.sh
source bench/gpu_step.sh
record_commit
SECS=80 ddtree_rounds d64_new1 ddtree 64
SECS=60 base_rounds d64_base1 ddtree 64
SECS=60 ddtree_rounds d64_new2 ddtree 64
SECS=60 base_rounds d64_base2 ddtree 64
finish s29e
