"""How fast can a Pallas (Triton) kernel merely read a decode step's K/V cache? A floor for issue 4.

    python3 -m bench.probe_read_floor --prefixes 4096,8192 --out DIR       # GPU
    python3 -m bench.probe_read_floor --small                              # CPU smoke run (interpret)

Issue 4 asks decode attention for >= 80 % of the bytes floor (prefix K+V / 3.3 TB/s) from a
4096-token prefix: 6.4 us for the 8B layer's 16.8 MB. Session 14's decode takes 9.4 us by device
span (its kernel 7.8 + the merge 1.9). This probe times a kernel that does nothing but read the
same bytes with the decode kernel's decomposition (a program per (prefix chunk, batch row, kv
head), keys in blocks of `block_k` through a software-pipelined loop) and add them up: what a
kernel of that shape needs to read the bytes, without the attention's math. (Not a strict bound:
session 36, H200, 4096-token prefix, the decode's own 32x64w4s4 read 8.5 us against the attention
kernel's 7.7; the fastest read, 64x64w4s2, 6.2 us, 82 % of the floor.) Configs are CHUNKSxBLOCK_Kw WARPS s STAGES
(e.g. 32x64w4s4: the decode's 256 programs of 128 keys); each is traced in bench_kernels'
chain (20 calls in one jit, caches rotated over >= 160 MB so that every call reads from HBM).
The decode attention itself (the default config) is traced alongside, on the same inputs.

Reported per call, us: the read kernel's device time, the span of the call (the read kernel
plus the small XLA fusion that feeds its sum into the chain), and the bytes floor's share of
the kernel time. Results: DIR/read_floor.json.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from bench.bench_kernels import floors, make_case, trace_chain, time_chain
from ddtree_jax.kernels import attention
from ddtree_jax.kernels.tree_attention import _compiler_params

CONFIG_RE = re.compile(r"^(\d+)x(\d+)w(\d+)s(\d+)$")
DEFAULT_CONFIGS = "16x64w4s4,32x64w4s4,32x128w4s3,64x64w4s2,16x128w8s4,32x64w8s4"


def parse_config(text: str) -> tuple[int, int, int, int]:
    m = CONFIG_RE.match(text)
    if not m:
        raise ValueError(f"read config {text!r}: expected CHUNKSxBLOCK_KwWARPSsSTAGES, e.g. 32x64w4s4")
    return tuple(int(x) for x in m.groups())


def _read_kernel(seed_ref, k_ref, v_ref, out_ref, *, block_k: int, steps: int):
    """One (chunk, batch row, kv head): sum `steps` blocks of block_k keys of K and V, from the
    chunk's first key, plus the batch row's seed, into out [Dh] (float32)."""
    base = pl.program_id(0) * steps * block_k

    def body(j, acc):
        rows = pl.ds(pl.multiple_of(base + j * block_k, block_k), block_k)
        return acc + k_ref[rows, :].astype(jnp.float32) + v_ref[rows, :].astype(jnp.float32)

    acc = lax.fori_loop(0, steps, body, jnp.zeros((block_k, k_ref.shape[-1]), jnp.float32))
    out_ref[...] = acc.sum(axis=0) + seed_ref[()]


def read_cache(seed, k_cache, v_cache, *, chunks: int, block_k: int, warps: int, stages: int, interpret: bool):
    """Every key of k_cache / v_cache [Bt, Hkv, S, Dh] read once: float32 [Bt, Hkv, chunks, Dh]
    block sums plus seed[b] (float32 [Bt]). S must be a multiple of chunks x block_k.

    The seed is what keeps a chain of calls honest: a read that depends only on the cache is the
    same computation for every call on the same cache copy, and XLA keeps one of them (session
    33's first run timed 3 reads for 20 calls at 16k: 600 % "of the floor")."""
    bt, hkv, s, dh = k_cache.shape
    if s % (chunks * block_k):
        raise ValueError(f"a {s}-key cache does not cut into {chunks} chunks of whole {block_k}-key blocks")
    row = pl.BlockSpec((None, None, s, dh), lambda c, b, h: (b, h, 0, 0))
    scalar = pl.BlockSpec((None,), lambda c, b, h: (b,))
    return pl.pallas_call(
        functools.partial(_read_kernel, block_k=block_k, steps=s // (chunks * block_k)),
        grid=(chunks, bt, hkv),
        in_specs=[scalar, row, row],
        out_specs=pl.BlockSpec((None, None, None, dh), lambda c, b, h: (b, h, c, 0)),
        out_shape=jax.ShapeDtypeStruct((bt, hkv, chunks, dh), jnp.float32),
        compiler_params=_compiler_params(warps, stages, interpret),
        interpret=interpret,
        name="read_floor",
    )(seed.astype(jnp.float32), k_cache, v_cache)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m bench.probe_read_floor", description=__doc__.splitlines()[0])
    ap.add_argument("--prefixes", default="4096,8192")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--cold-mb", type=float, default=None, help="default 160 on a GPU, 0 elsewhere")
    ap.add_argument("--small", action="store_true", help="CPU smoke run: tiny heads, interpret mode")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        configs = [parse_config(c) for c in args.configs.split(",") if c]
        prefixes = [int(p) for p in args.prefixes.split(",") if p]
    except ValueError as e:
        ap.error(str(e))
    on_gpu = jax.devices()[0].platform == "gpu"
    interpret = not on_gpu
    hq, hkv, dh = (8, 2, 64) if args.small else (32, 8, 128)
    inner = 2 if args.small else args.inner
    cold = int((args.cold_mb if args.cold_mb is not None else (160.0 if on_gpu else 0.0)) * 1e6)
    out = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "heads": [hq, hkv, dh],
           "inner": inner, "cold_mb": cold / 1e6, "rows": []}
    attn_impl = "pallas" if on_gpu else "pallas_interpret"
    for p in prefixes:
        case = make_case(jax.random.PRNGKey(p), bt=1, t=1, s=p, hq=hq, hkv=hkv, dh=dh, dtype=jnp.bfloat16)
        floor_us = floors(1, p, hq, hkv, dh, 2)[0] * 1e6    # the prefix's K + V bytes / 3.3 TB/s

        def attend(q, k_new, v_new, kc, vc, cache_len, mask):
            return attention(q, k_new, v_new, kc, vc, cache_len, mask, scale=dh**-0.5, impl=attn_impl)

        fns = {"attention (default)": attend}
        for chunks, block_k, warps, stages in configs:
            if p % (chunks * block_k):
                print(f"[read_floor] prefix {p}: {chunks}x{block_k} skipped (not whole blocks)", flush=True)
                continue

            def read(q, k_new, v_new, kc, vc, cache_len, mask, cfg=(chunks, block_k, warps, stages)):
                # each call's read depends on the call before (its q), so none is dropped or shared
                s = read_cache(q[:, 0, 0, 0], kc, vc, chunks=cfg[0], block_k=cfg[1], warps=cfg[2],
                               stages=cfg[3], interpret=interpret)
                return q + (s.max() > 3e38).astype(q.dtype)   # a use XLA cannot fold away
            fns[f"{chunks}x{block_k}w{warps}s{stages}"] = read
        for name, fn in fns.items():
            row = {"prefix": p, "config": name, "floor_us": floor_us}
            try:
                row["wall_us"] = 1e6 * time_chain(fn, case, inner=inner, reps=3, cold_bytes=cold)
                if on_gpu:
                    tr = trace_chain(fn, case, inner=inner, cold_bytes=cold)
                    main_us = tr["kernels_us"].get("read_floor", max(tr["kernels_us"].values()))
                    row.update(kernel_us=main_us, span_us=tr["span_us"], kernels_us=tr["kernels_us"],
                               pct_floor_kernel=100 * floor_us / main_us, pct_floor_span=100 * floor_us / tr["span_us"])
            except Exception as e:  # one config failing to compile should not lose the others
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            out["rows"].append(row)
            figs = (f"kernel {row['kernel_us']:.1f} us ({row['pct_floor_kernel']:.0f} % of floor), span "
                    f"{row['span_us']:.1f}" if "kernel_us" in row else row.get("error", f"wall {row.get('wall_us', 0):.1f} us"))
            print(f"[read_floor] prefix {p} (floor {floor_us:.1f} us) {name:20s} {figs}", flush=True)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, "read_floor.json"), "w") as f:
                    json.dump(out, f, indent=1)
    return 1 if any("error" in r for r in out["rows"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
