#!/usr/bin/env bash
# Session 40 (one call, ~9.5 min): (1) the float32 tiles of c1f037d on the device: bench_kernels'
# correctness cases (its two float32 cases failed on s39a's H100: 256 KB of shared memory) and a
# Dh = 64 float32 check at T = 1 / 16 / 65 with decode's new 32-key, 2-stage tiles against the
# bf16 decode tiles; (2) gpu_next_s39c.sh's table (issue 4: T = 65 / 257 over the prefixes it
# needs most first, the engine column beside Triton, XLA and cuDNN) on shorter budgets; (3) the
# decode merge's tile at 512 keys (s39b's steps ended after one row: 96725af).
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s40b.sh
source bench/gpu_step.sh
record_commit
export R
step correct 110 python3 bench/bench_kernels.py --ts 1 --no-sweep --split-prefixes "" --no-table --budget-s 100 \
  --out "$R/correct"
step f32_dh64 60 python3 - <<'EOF'
import dataclasses, json, jax, jax.numpy as jnp
from bench.bench_kernels import make_case, rel_err, time_chain
from pallas_kernels.tree_attention import attention, attention_reference, default_config
for t, variants in ((1, {"default": {}, "bf16_decode_tiles": dict(block_k=64, num_stages=3)}),
                    (16, {"default": {}}), (65, {"default": {}})):
    a = make_case(jax.random.PRNGKey(t), bt=2, t=t, s=4096, hq=8, hkv=2, dh=64, dtype=jnp.float32,
                  cache_len=(4001, 77), poison=True)
    truth = jax.jit(lambda *x: attention_reference(*x, scale=0.125))(*a)
    for name, kw in variants.items():
        cfg = dataclasses.replace(default_config(t, 4, 64, 4), **kw)
        f = lambda *x, cfg=cfg: attention(*x, scale=0.125, impl="pallas", config=cfg)
        row = dict(dh=64, t=t, variant=name)
        try:
            o = jax.jit(f)(*a)
            row.update(rel_err=rel_err(o, truth), nan=bool(jnp.isnan(o).any()),
                       us=1e6 * time_chain(f, a, inner=10, reps=5))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(json.dumps(row), flush=True)
EOF
for T in 65 257; do
  step table_$T 190 python3 bench/bench_kernels.py --ts $T --prefixes 4096,8192,32768,1024,16384,2048 --no-sweep \
    --split-prefixes "" --no-correctness --budget-s 180 --out "$R/table_$T"
done
decode_tiles merge_512 512 0,14,15,16,0,14,15,16 80
finish s40b
