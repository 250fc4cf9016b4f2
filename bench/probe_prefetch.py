"""Can a verify layer's latency-bound kernels pull the next product's weights into L2?

At DDTree-64 (65 rows) a verify layer is ~128 us against 89.6 us of weight bytes (session 12's
profile): the products run at 2.8-4.0 TB/s, and while the attention, its merge and the norms run
(~21 us a layer, latency-bound) HBM sits nearly idle. This probe measures, on the 8B shape:

* the o product (65 x 4096 @ 4096 x 4096) with its weight cold (a new weight per call) and
  L2-warm (the same weight every call): the most that a prefetch could give;
* a chain of layers [Pallas tree attention (T = 65, prefix 512) -> o product], as the verify
  pass runs them, without and with a prefetch of the product's weight (a max-reduction over it)
  on a second stream (`jax.experimental.compute_on("gpu_stream:1")`), started once the layer's
  input exists and joined before the product; and the same prefetch on the main stream, which
  must not help (its read is not hidden);
* the same for the down product (65 x 12288 @ 12288 x 4096), prefetching its first rows only
  (the whole weight is 100 MB, twice the L2).

    python3 -m bench.probe_prefetch --out DIR       # GPU
    python3 -m bench.probe_prefetch --small         # CPU smoke run (the stream annotation is ignored)

Session 13 (bench/RESULTS.md): the o product L2-warm was only ~2.5 us faster than cold (21.7 vs
19.3 us a layer with its scaling), and jax 0.11.2's XLA ran the annotated read in line (no
call-start in the compiled HLO, with or without XLA_FLAGS=--xla_gpu_experimental_stream_annotation=
true), so the read was never hidden. The model-side prefetch (DDTREE_L2_PREFETCH) was removed;
this probe stays to re-check on a later jax. Times: median of --calls synced calls of a jitted fori_loop over --inner passes of the layer
chain, divided by the layers run. One process, one machine start: compare rows with each other.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jax.experimental import compute_on as _compute_on

from bench.bench_kernels import random_tree_mask
from bench.probe_decode import per_call
from ddtree_jax.kernels import attention


def on_side_stream(f):
    """f run as an async call on a second GPU stream, where XLA honours the annotation (it did
    not in session 13, see the docstring above). jax 0.10 calls the function form compute_on2,
    0.11 compute_on."""
    form = getattr(_compute_on, "compute_on2", _compute_on.compute_on)
    space = jax.memory.Space.Device if hasattr(jax, "memory") else jax._src.core.MemorySpace.Device
    return form(f, compute_type="gpu_stream:1", out_memory_spaces=space)


@on_side_stream
def _prefetch_side(w):
    """Read w once (a max over it) on the second stream: its lines end up in L2."""
    return jnp.max(w)


@jax.jit
def _prefetch_main(w):
    return jnp.max(w)


def _with_prefetch(w, after, mode: str, rows: int | None):
    """w, once a read of w[:rows] has run (mode "side": on stream 1; "main": in line; "none"):
    the read may not start before `after` exists, and the product that takes the returned w waits
    for it."""
    if mode == "none":
        return w
    src, _ = jax.lax.optimization_barrier((w, after))
    part = src if rows is None else src[:rows]
    tok = (_prefetch_side if mode == "side" else _prefetch_main)(part)
    w, _ = jax.lax.optimization_barrier((w, tok))
    return w


def layer_chain(shape: str, attend: bool, mode: str, frac: float, layers: int, inner: int, impl: str):
    """A jitted fn(x, ws, caches) running `inner` passes of `layers` x [attention -> product]."""

    def fn(x, ws, kc, vc, cache_len, mask):
        def one_pass(_, x):
            for i in range(layers):
                w = ws[i] if isinstance(ws, list) else ws
                rows = None if frac >= 1 else max(8, int(w.shape[0] * frac) // 8 * 8)
                if attend:
                    bt, t, hid = x.shape
                    q = x.reshape(bt, t, 32, hid // 32)
                    kv = x[..., : hid // 4].reshape(bt, t, 8, hid // 32)
                    w = _with_prefetch(w, x, mode, rows)
                    o = attention(q, kv, kv, kc[i], vc[i], cache_len, mask, scale=0.088, impl=impl)
                    h = o.reshape(bt, t, hid)
                else:
                    w = _with_prefetch(w, x, mode, rows)
                    h = x
                if shape == "down":
                    h = jnp.concatenate([h, h, h], axis=-1)
                y = jnp.einsum("bti,io->bto", h, w)
                x = (y * 0.01).astype(x.dtype)
            return x

        return jax.lax.fori_loop(0, inner, one_pass, x)

    return jax.jit(fn)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probe_prefetch", description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU smoke run)")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--inner", type=int, default=4)
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--fracs", default="0.25,0.5", help="down: fractions of its rows to prefetch")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    dtype = jnp.bfloat16
    if args.small:
        hid, t, s, layers, inner, calls, impl = 512, 17, 64, 2, 1, 2, "pallas_interpret"
    else:
        hid, t, s, layers, inner, calls, impl = 4096, 65, 2816, args.layers, args.inner, args.calls, "pallas"
    key = jax.random.PRNGKey(0)
    x = jax.random.normal(key, (1, t, hid), jnp.float32).astype(dtype)
    dh = hid // 32

    @functools.partial(jax.jit, static_argnums=1)
    def weight(key, k):
        return (jax.random.normal(key, (k, hid), jnp.float32) * 0.02).astype(dtype)

    def weights(key, k):  # one array per layer: a slice of a stacked array may be copied
        return [weight(jax.random.fold_in(key, i), k) for i in range(layers)]

    kc = [(jax.random.normal(jax.random.fold_in(key, 100 + i), (1, 8, s, dh), jnp.float32)).astype(dtype)
          for i in range(layers)]
    vc = [(jax.random.normal(jax.random.fold_in(key, 200 + i), (1, 8, s, dh), jnp.float32)).astype(dtype)
          for i in range(layers)]
    cache_len = jnp.full((1,), min(512, s), jnp.int32)
    mask = jnp.asarray(random_tree_mask(np.random.default_rng(0), t)[None])
    res = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "rows": t, "layers": layers,
           "inner": inner, "us_per_layer": {}}
    ws = {"o": weights(jax.random.fold_in(key, 1), hid), "down": weights(jax.random.fold_in(key, 2), 3 * hid)}
    runs = [("o", False, "none", 1.0, "cold"), ("o", False, "none", 1.0, "warm"),
            ("o", True, "none", 1.0, "cold"), ("o", True, "side", 1.0, "cold"), ("o", True, "main", 1.0, "cold"),
            ("o", True, "none", 1.0, "cold")]
    runs += [("down", True, "none", 1.0, "cold")]
    runs += [("down", True, "side", float(f), "cold") for f in args.fracs.split(",")]
    runs += [("down", True, "none", 1.0, "cold")]
    for shape, attend, mode, frac, temp in runs:
        name = f"{'attn+' if attend else ''}{shape}_{temp}" + ("" if mode == "none" else f"_pf{mode}{frac:g}")
        name += "_again" if name in res["us_per_layer"] else ""  # the baselines run first and last
        w = ws[shape] if temp == "cold" else ws[shape][0]
        fn = layer_chain(shape, attend, mode, frac, layers, inner, impl)
        if mode == "side" and not args.small:
            text = fn.lower(x, w, kc, vc, cache_len, mask).compile().as_text()
            print(f"[prefetch] {name}: {text.count('call-start')} call-start in the compiled HLO", flush=True)
        sec = per_call(fn, x, w, kc, vc, cache_len, mask, calls=calls)
        us = 1e6 * sec / (layers * inner)
        res["us_per_layer"][name] = us
        print(f"[prefetch] {name:32s} {us:8.2f} us a layer", flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "probe_prefetch.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
