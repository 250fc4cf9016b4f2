#!/usr/bin/env bash
# Session 40 (~3 min): float32 tiles that fit in shared memory. s39a's on-device correctness run
# (H100, b4ca6ac) failed both float32 cases (T = 16 and 65, Dh = 128): the Triton kernel asked
# for 262144 bytes of shared memory against 232448 available (64x64 tiles, 3 stages, 4-byte
# operands). This compiles the float32 kernel at T = 1 / 16 / 65 / 257 (G = 4), Dh = 64 and 128,
# over tile variants, and prints for each: ok (with its error against a float32 XLA reference and
# its time a call over a 4k cache) or the shared memory it requested.
# Usage (device tool, carry bench/.device_commit): BUDGET_S=<the call's limit less ~30> bash bench/sessions/gpu_next_s40a.sh
source bench/gpu_step.sh
record_commit
export R
step f32_tiles 240 python3 - <<'EOF'
import dataclasses, json, os, re, jax, jax.numpy as jnp
from bench.bench_kernels import make_case, rel_err, time_chain
from pallas_kernels.tree_attention import attention, attention_reference, default_config
variants = {"default": {}, "stages2": dict(num_stages=2), "stages1": dict(num_stages=1),
            "bk32": dict(block_k=32), "bk32_stages2": dict(block_k=32, num_stages=2)}
rows = []
for dh in (128, 64):
    for t in (1, 16, 65, 257):
        a = make_case(jax.random.PRNGKey(t), bt=1, t=t, s=4096, hq=32, hkv=8, dh=dh, dtype=jnp.float32,
                      cache_len=(4001,))
        truth = jax.jit(lambda *x: attention_reference(*x, scale=dh ** -0.5))(*a)
        for name, kw in variants.items():
            cfg = dataclasses.replace(default_config(t, 4, dh, 4), **kw)
            row = dict(dh=dh, t=t, variant=name, config=dataclasses.asdict(cfg))
            f = lambda *x, cfg=cfg: attention(*x, scale=dh ** -0.5, impl="pallas", config=cfg)
            try:
                o = jax.jit(f)(*a)
                row["rel_err"] = rel_err(o, truth)
                row["us"] = 1e6 * time_chain(f, a, inner=10, reps=5)
            except Exception as e:
                m = re.search(r"requested (\d+), available: (\d+)", str(e))
                row["error"] = (f"smem {m.group(1)} > {m.group(2)}" if m else f"{type(e).__name__}: {str(e)[:300]}")
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "config"}), flush=True)
json.dump(rows, open(os.environ["R"] + "/f32_tiles.json", "w"), indent=1)
EOF
finish s40a
