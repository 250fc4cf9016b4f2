#!/usr/bin/env bash
# Session 26 (~5 min): what a Pallas Mosaic GPU GEMM reaches at the verify shapes (JAX's own
# warp-specialized Hopper matmul against XLA's dot), before building a GEMM of our own.
# Usage (device tool, carry bench/.device_commit): bash bench/sessions/gpu_next_s26c.sh
source bench/gpu_step.sh
record_commit
step probe_gemm 500 python3 -m bench.probe_gemm_mgpu --out "$R/probe_gemm"
finish s26c
