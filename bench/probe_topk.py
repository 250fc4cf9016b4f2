"""Where the vocabulary first stage's device time goes: chunk_top_k's threshold kernel against
stripped-down kernels of the same grid (a row's chunk a program), by device time.

    python3 -m bench.probe_topk --out DIR                       # GPU: 15 x 151936, 128 chunks keep 64
    python3 -m bench.probe_topk --vocab 4096 --rows 2 --inner 1 --repeats 1 --no-trace   # CPU smoke

Session 18: the threshold kernel takes 34 us for 15 x 128 chunks of 1187 values (9 MB read), and
a variant that skips its 16 radix rounds in most chunks was no faster (bench/RESULTS.md). Each
variant here adds one piece of the threshold kernel to a plain load-and-store program:

- copy: load the chunk (gathered indices, as the kernel does), store its first `keep` values;
- copy_ds: the same load as one contiguous masked block;
- max: copy + one block max reduction;
- cumsum: copy + a prefix count over the chunk and the scatter of the lanes above a constant
  (`kept_slots`);
- radix: copy + the radix select of the keep-th key (`kth_largest`, 32 / radix_bits rounds);
- threshold: chunk_top_k(impl="threshold") itself.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from bench.bench_tree import timed, traced
from ddtree_jax.kernels.chunk_topk import chunk_top_k, kept_slots, kth_largest, order_key
from ddtree_jax.kernels.norms import _pow2_at_least, pltriton

VARIANTS = ("copy", "copy_ds", "max", "cumsum", "radix", "threshold")


def _probe_kernel(x_ref, out_ref, *, variant: str, length: int, width: int, keep: int, radix_bits: int):
    c = pl.program_id(1)
    lane = jnp.arange(width, dtype=jnp.int32)
    pos = c * length + lane
    v = x_ref.shape[0]
    valid = (lane < length) & (pos < v)
    if variant == "copy_ds":
        x = pltriton.load(x_ref.at[pl.ds(c * length, width)], mask=valid, other=-jnp.inf)
    else:
        x = pltriton.load(x_ref.at[jnp.minimum(pos, v - 1)], mask=valid, other=-jnp.inf)
    first = lane < keep
    slot = jnp.minimum(lane, keep - 1)
    if variant == "max":
        x = jnp.where(lane == 0, jnp.max(x), x)
    elif variant == "cumsum":
        take = valid & (x > -8.0)
        slot = kept_slots(take, keep, keep + 1)
        first = take & (slot < keep)
        slot = jnp.minimum(slot, keep - 1)
    elif variant == "radix":
        kth = kth_largest(order_key(x), valid, keep, radix_bits)
        x = jnp.where(lane == 0, kth.astype(jnp.float32), x)
    pltriton.store(out_ref.at[slot], x, mask=first)


def probe(x: jax.Array, chunks: int, keep: int, variant: str, *, num_warps: int = 4, radix_bits: int = 2,
          interpret: bool = False) -> jax.Array:
    """One variant over x [rows, V]: [rows, chunks, keep] float32 (what it stores; not a top-k)."""
    if variant == "threshold":
        impl = "threshold_interpret" if interpret else "threshold"
        return chunk_top_k(x, chunks, keep, impl=impl, num_warps=num_warps, radix_bits=radix_bits)[0]
    rows, v = x.shape
    length = -(-v // chunks)
    width = _pow2_at_least(length)
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    return pl.pallas_call(
        functools.partial(_probe_kernel, variant=variant, length=length, width=width, keep=keep,
                          radix_bits=radix_bits),
        grid=(rows, chunks),
        in_specs=[pl.BlockSpec((None, v), lambda r, c: (r, 0))],
        out_specs=pl.BlockSpec((None, None, keep), lambda r, c: (r, c, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, chunks, keep), jnp.float32),
        compiler_params=params,
        interpret=interpret,
        name=f"probe_{variant}",
    )(x)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probe_topk", description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rows", type=int, default=15)
    ap.add_argument("--chunks", default="128", help="chunk counts to try, comma-separated")
    ap.add_argument("--keep", type=int, default=64)
    ap.add_argument("--warps", default="4", help="num_warps values to try, comma-separated")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                    help="device time by the profiler (default: on a GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    variants = [x for x in args.variants.split(",") if x]
    bad = set(variants) - set(VARIANTS)
    if bad:
        ap.error(f"--variants: {', '.join(sorted(bad))}: choose from {', '.join(VARIANTS)}")
    trace = jax.default_backend() == "gpu" if args.trace is None else args.trace
    interpret = jax.default_backend() != "gpu"
    x = jax.nn.log_softmax(3.0 * jax.random.normal(jax.random.PRNGKey(0), (args.rows, args.vocab)), -1)
    rows = []
    for chunks in (int(c) for c in args.chunks.split(",")):
        for warps in (int(w) for w in args.warps.split(",")):
            for variant in variants:
                fn = functools.partial(probe, chunks=chunks, keep=args.keep, variant=variant, num_warps=warps,
                                       interpret=interpret)
                r = dict(variant=variant, chunks=chunks, warps=warps,
                         ms=timed(fn, x, args.inner, args.repeats))
                if trace:
                    t = traced(fn, x, args.inner)
                    r["kernel_us"] = sum(us for name, us in t.get("kernels_us", {}).items()
                                         if name.startswith(("probe_", "chunk_top_k")))
                    r["span_us"] = t.get("span_us")
                rows.append(r)
                print(f"[probe_topk] {variant:9s} chunks {chunks:4d} warps {warps}: {r['ms']:.4f} ms a call"
                      + (f", kernel {r['kernel_us']:.1f} us" if "kernel_us" in r else ""), flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "probe_topk.json").write_text(json.dumps(
            dict(device=jax.devices()[0].device_kind, jax=jax.__version__, vocab=args.vocab, rows=args.rows,
                 keep=args.keep, results=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
