#!/usr/bin/env bash
# Session 33 (~2 min; one call): issue 4's read floor. How fast can a Pallas Triton kernel merely
# read a decode step's K/V (the decode kernel's decomposition, configs CHUNKSxBLOCK_KwWARPSsSTAGES)
# against the decode attention itself, by device time, caches HBM-cold?
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s33b.sh
source bench/gpu_step.sh
record_commit
step read_floor 200 python3 -m bench.probe_read_floor --prefixes 4096,8192,16384 \
  --configs 16x64w4s4,32x64w4s4,32x128w4s3,64x64w4s2,16x128w8s4,32x64w8s4,16x256w8s3,8x512w8s3 --out "$R/read_floor"
finish s33b
