#!/usr/bin/env bash
# Prepared in session 5, not yet run. Issues 3 and 6: the 8B round table at one commit with the
# corrected stage timer (session 4's stage columns were invalid: bench_round mixed the verify
# forward and the choose call in one median, and timed its own state copy in the commit):
# (1) the baseline, XLA's dots and cache writes (no stages); (2) the new kernels with stages and
# the verify pass alone in a device loop (--verify-loop: issue 6's overhead beyond the verify):
# impl="auto" matmuls (the skinny-matmul kernel where pallas_kernels/matmul_configs.json says it
# won: commit gpu_next_s6a.sh's table first, or this measures XLA's dots again) and the
# one-kernel cache writes; (3) DDTree-64 with each of cache writes xla/pallas x drafter bf16/int8.
# ~9 min: the 8B weights now build in seconds (init per layer, jitted once).
# Usage (device tool): bash bench/sessions/gpu_next_s6b.sh -> $OUT/s6b.tar.xz
source bench/gpu_step.sh
# The tuned table must hold this GPU's entries (committed after gpu_next_s6a.sh); without them
# "auto" is XLA's dots again, so the kernel is forced (default configs) instead.
N=$(python3 -c "import json, jax; print(len(json.load(open('pallas_kernels/matmul_configs.json')).get(jax.devices()[0].device_kind, [])))")
MM=auto; if [ "${N:-0}" = "0" ]; then MM=pallas; echo "=== WARNING: no tuned matmul entries for this GPU: --matmul-impl pallas"; fi
echo "=== $N tuned matmul entries; new-kernel rows use --matmul-impl $MM" | tee "$R/matmul_table.txt"
step round_xla 140 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 64,256 --rounds 32 --repeats 3 --stage-repeats 0 --matmul-impl xla --cache-impl xla \
  --out "$R/round_xla"
step round_new 270 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ar,dflash,ddtree \
  --budgets 64,256 --rounds 32 --repeats 3 --stage-repeats 2 --verify-loop --matmul-impl $MM --cache-impl pallas \
  --out "$R/round_new"
step ab 150 python3 -m bench.bench_round --model qwen3-8b --prompt-len 512 --methods ddtree --budgets 64 \
  --rounds 32 --repeats 3 --stage-repeats 0 --matmul-impl $MM --cache-impl xla,pallas --drafter-quant none,int8 \
  --out "$R/ab"
finish s6b
