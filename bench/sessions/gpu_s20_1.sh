#!/usr/bin/env bash
# Session 20, call 1 (~8 min): the first half of session 19's plan gpu_next_s20a.sh (removed; s20_2-3 ran the rest).
# (1) Where the Mosaic GPU verify kernel loses its lead inside the round: two DDTree-64 profiles,
# the kernel on (72:64x4w2k) and off: per-kernel device time and the idle gaps around
# entry_mosaic_gpu_kernel (command buffers split by the Mosaic custom call are the suspect).
# (2) The round table at the defaults (Mosaic GPU attention for T 257-520): AR, DFlash,
# DDTree-16 / 64 / 256, for README and RESULTS' top table.
source bench/gpu_step.sh
record_commit
step prof_on 130 env DDTREE_MGPU_ATTENTION=8-1100 DDTREE_MGPU_CONFIG=72:64x4w2k python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 --out "$R/prof_on"
step prof_off 110 env DDTREE_MGPU_ATTENTION=off python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 --out "$R/prof_off"
SECS=200 ddtree_rounds table ar,dflash,ddtree 16,64,256
finish s20_1
