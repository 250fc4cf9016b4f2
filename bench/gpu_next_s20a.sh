#!/usr/bin/env bash
# Prepared in session 19 for the next session (~15 min). (1) Where the Mosaic GPU verify kernel
# loses its lead inside the round: alone it beats the Triton kernel by 2.6 us a layer at T = 72
# and 8.6 at T = 264, yet DDTree-64 ran 0.13-0.20 ms slower with it and DDTree-256 gained only
# ~0.1 ms (session 19, s19_2-4; the verify padding is not the cause). Two DDTree-64 profiles, the
# kernel on and off: per-kernel device time and the idle gaps around entry_mosaic_gpu_kernel
# (command buffers split by the Mosaic custom call are the suspect). (2) The round table at the
# defaults (Mosaic GPU attention for T 257-520): AR, DFlash, DDTree-16 / 64 / 256, for README and
# RESULTS' top table. (3) check_gpu --impl auto: the target's forward with "auto" attention (the
# Mosaic GPU kernel at T = 264) against XLA. (4) Session 18's leftover from gpu_next_s19a.sh:
# probe_topk.
# Usage (device tool, carry bench/.device_commit): bash bench/gpu_next_s20a.sh
source bench/gpu_step.sh
record_commit
step prof_on 130 env DDTREE_MGPU_ATTENTION=8-1100 DDTREE_MGPU_CONFIG=72:64x4w2k python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 --out "$R/prof_on"
step prof_off 110 env DDTREE_MGPU_ATTENTION=off python3 -m bench.profile_round \
  --model qwen3-8b --prompt-len 512 --methods ddtree:64 --rounds 32 --out "$R/prof_off"
step check 120 python3 -m bench.check_gpu --impl auto --layers 2
# (5) Session 19's skip_empty (the s suffix, unmeasured): alone at T = 264 and 1032, then in the
# DDTree-256 / 1024 rounds (1024 only with the range widened: Triton's skip serves it now).
step mgpu 200 python3 -m bench.bench_mgpu --ts 264,1032 --prefixes 512 --configs triton,64x3w2,64x3w2s,64x4w2ks \
  --inner 8 --out "$R/mgpu"
CFG=$(python3 -m bench.pick_mgpu "$R/mgpu/mgpu.json"); echo "picked: $CFG" | tee "$R/picked.txt"
SECS=150 ddtree_rounds skip ddtree 256,1024 DDTREE_MGPU_ATTENTION=257-1100 DDTREE_MGPU_CONFIG="${CFG:-64x3w2s}"
SECS=130 ddtree_rounds noskip ddtree 256,1024
SECS=200 ddtree_rounds table ar,dflash,ddtree 16,64,256
step probe 120 python3 -m bench.probe_topk --warps 4,8 --out "$R/probe"
finish s20a
