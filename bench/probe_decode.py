"""Ceilings for one decode step in XLA: copy bandwidth, GEMV bandwidth per weight layout, and a
weights-only decoder step (every matmul and norm of the 8B shape, no attention, no cache).

    python3 -m bench.probe_decode --out DIR          # GPU
    python3 -m bench.probe_decode --small            # CPU smoke run

What it answers: how close XLA's batch-1 matmuls get to the HBM floor, whether an [out, in]
weight layout (x @ W.T) reads faster than [in, out], and what a step costs with nothing but
weight reads, so the rest of the gap can be charged to attention, cache writes and launches.
Copy and GEMV figures: the median of 20 synced calls, each moving ~2-4 GB (far beyond the L2);
the decoder step: a jitted fori_loop of steps over 15 GB of weights.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp


def timeit(fn, *args, inner: int, repeats: int = 5) -> float:
    """Median seconds per inner step of fn(*args) (fn runs `inner` steps itself)."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append((time.perf_counter() - t0) / inner)
    return statistics.median(ts)


def per_call(fn, *args, calls: int = 20) -> float:
    """Median seconds of one call of a jitted fn, over `calls` synced calls (each call is large
    enough, hundreds of microseconds, that dispatch is a small part)."""
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(calls):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def copy_bw(nbytes: int) -> float:
    """Bytes read + written per second by one elementwise pass over nbytes of bf16."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    return 2 * nbytes / per_call(jax.jit(lambda x: x + 1), x)


def gemv_bw(k: int, n: int, copies: int, layout: str, dtype) -> float:
    """Weight bytes per second of `copies` independent [1, k] x [k, n] products in one call.

    Each product gets its own input row, so XLA cannot merge them into one batched matmul.
    """
    key = jax.random.PRNGKey(0)
    shape = (copies, k, n) if layout == "io" else (copies, n, k)
    w = jax.random.normal(key, shape, jnp.float32).astype(dtype)
    x = jax.random.normal(key, (1, k), jnp.float32).astype(dtype)
    eq = "bk,kn->bn" if layout == "io" else "bk,nk->bn"

    @jax.jit
    def f(w, x):
        return [jnp.einsum(eq, x * (c + 1), w[c]) for c in range(copies)]

    return copies * k * n * jnp.dtype(dtype).itemsize / per_call(f, w, x)


def weights_only_step(h: int, inter: int, nq: int, nkv: int, layers: int, vocab: int, layout: str, inner: int,
                      dtype) -> tuple[float, int]:
    key = jax.random.PRNGKey(1)
    shapes = {"qkv": (h, nq + 2 * nkv), "o": (nq, h), "gate_up": (h, 2 * inter), "down": (inter, h)}

    def mk(i, name):
        k, n = shapes[name]
        return jax.random.normal(jax.random.fold_in(key, i * 8 + len(name)), (k, n) if layout == "io" else (n, k),
                                 jnp.float32).astype(dtype)

    ws = [{n: mk(i, n) for n in shapes} for i in range(layers)]
    head = jax.random.normal(key, (h, vocab) if layout == "io" else (vocab, h), jnp.float32).astype(dtype)
    nbytes = sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(ws)) + head.size * head.dtype.itemsize
    eq = "bk,kn->bn" if layout == "io" else "bk,nk->bn"

    def lin(x, w):
        return jnp.einsum(eq, x, w)

    def norm(x):
        x32 = x.astype(jnp.float32)
        return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)).astype(dtype)

    @jax.jit
    def f(ws, head, x0):
        def body(i, x):
            for p in ws:
                q = lin(norm(x), p["qkv"])
                x = x + lin(q[:, :nq], p["o"])
                g, u = jnp.split(lin(norm(x), p["gate_up"]), 2, axis=-1)
                x = x + lin(jax.nn.silu(g) * u, p["down"])
            logits = jnp.einsum(eq, norm(x), head, preferred_element_type=jnp.float32)
            return x + (jnp.argmax(logits, -1)[:, None] % 2).astype(dtype)

        return jax.lax.fori_loop(0, inner, body, x0)

    x0 = jnp.ones((1, h), dtype)
    return timeit(f, ws, head, x0, inner=inner), nbytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probe_decode", description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dtype = jnp.bfloat16
    res: dict = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
    if args.small:
        dims = dict(h=64, inter=128, nq=64, nkv=32, layers=2, vocab=512)
        gemvs, copies, inner, cbytes = [(64, 192)], 2, 4, 1 << 20
    else:
        dims = dict(h=4096, inter=12288, nq=4096, nkv=1024, layers=36, vocab=151936)
        gemvs = [(4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936)]
        copies, inner, cbytes = 64, 50, 4 << 30
    res["copy_TBps"] = copy_bw(cbytes) / 1e12
    print(f"[probe] copy (read+write) {res['copy_TBps']:.2f} TB/s", flush=True)
    res["gemv"] = []
    for k, n in gemvs:
        for layout in ("io", "oi"):
            c = max(2, min(copies, int(2e9 // (2 * k * n))))  # ~2 GB of weights per call
            bw = gemv_bw(k, n, c, layout, dtype) / 1e12
            res["gemv"].append(dict(k=k, n=n, layout=layout, TBps=bw))
            print(f"[probe] gemv [1,{k}] x {layout} {k}x{n}: {bw:.2f} TB/s", flush=True)
    for layout in ("io", "oi"):
        t, nbytes = weights_only_step(**dims, layout=layout, inner=max(inner // 5, 2), dtype=dtype)
        res[f"weights_only_step_{layout}"] = dict(ms=1e3 * t, GB=nbytes / 1e9, TBps=nbytes / t / 1e12)
        print(f"[probe] weights-only decoder step ({layout}): {1e3 * t:.3f} ms for {nbytes / 1e9:.2f} GB "
              f"= {nbytes / t / 1e12:.2f} TB/s", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe_decode.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
