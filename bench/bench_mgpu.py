"""The Mosaic GPU verify-attention kernel against the Triton one, alone: exactness and device time.

    python -m bench.bench_mgpu --ts 72,264 --prefixes 512,4096 --configs 64x3w2,64x3w1 \
        --out bench/results/mgpu

For each tree size T (a multiple of 8: the engine pads the verify to one) and committed prefix,
on a DDTree-like random tree mask with Qwen3-8B's heads (32 q heads, 8 kv heads, Dh 128, bf16):
the relative error of each kernel against the XLA reference (with the cache's stale tail
poisoned with NaN, and a ragged cache_len), then each kernel's device time per call by the
profiler (a chain of calls whose caches rotate over >= 160 MB, as a forward's layers read their
own caches). Configs are ``BKxSTAGESwWGS[k][s][cN][o][tN][m]`` (tree_attention_mgpu.parse_config);
``triton`` is the engine's Triton kernel at its tuned tiles. Writes mgpu.json under --out, and with
two prefixes or more mgpu_prefix.png (bench.plots.mgpu_prefix) beside it; prints the fastest exact
config per T last (``--pick OUT/mgpu.json`` prints it for an earlier run), the candidate for
tree_attention_mgpu's config tables once a round A/B confirms it.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import jax
import jax.numpy as jnp

from bench.bench_kernels import int_list, make_case, rel_err, trace_chain
from bench.plots import MGPU_HEADS
from ddtree_jax.kernels import attention, dispatch
from ddtree_jax.kernels.tree_attention_mgpu import MgpuConfig, attention_mgpu
from ddtree_jax.kernels.tree_attention_mgpu import parse_config as mgpu_parse_config
from ddtree_jax.tuning import tuning_for

HEADS = MGPU_HEADS  # Qwen3-8B: query heads, kv heads, head dim


def timed_case(t: int, prefix: int, batch: int = 1):
    """The timed call's inputs: `batch` rows of T new tokens of a random tree over `prefix`
    committed keys, in a cache of prefix + 512 positions (bf16, 8B heads)."""
    hq, hkv, dh = HEADS
    return make_case(jax.random.key(t + prefix + 1), bt=batch, t=t, s=prefix + 512, hq=hq, hkv=hkv, dh=dh,
                     dtype=jnp.bfloat16, cache_len=[prefix] * batch)


def parse_config(text: str) -> MgpuConfig | None:
    return None if text == "triton" else mgpu_parse_config(text)


def fastest(rows: list[dict]) -> dict[int, str]:
    """The fastest Mosaic GPU config per T (by busy_us) among the exact ones (rel_err < 2e-2, no
    NaN); a T where none ran is left out."""
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        if r.get("config") == "triton" or "busy_us" not in r or r.get("nan") or r.get("rel_err", 1) >= 2e-2:
            continue
        t, us = r["t"], r["busy_us"]
        if t not in best or us < best[t][0]:
            best[t] = (us, r["config"])
    return {t: cfg for t, (_, cfg) in sorted(best.items())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_mgpu", description=__doc__.splitlines()[0])
    ap.add_argument("--ts", default="72,264", type=int_list)
    ap.add_argument("--prefixes", default="512,4096", type=int_list)
    ap.add_argument("--configs", default="triton,64x3w2,64x3w1")
    ap.add_argument("--inner", type=int, default=36)
    ap.add_argument("--cold-mb", type=int, default=160)
    ap.add_argument("--batch", type=int, default=1, help="batch rows (the exactness case's rows get "
                    "lengths 3 apart)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--pick", default=None, metavar="MGPU_JSON",
                    help="print the fastest exact config per T of an earlier run's mgpu.json, and run nothing")
    args = ap.parse_args(argv)
    if args.pick:
        with open(args.pick) as f:
            print(json.dumps(fastest(json.load(f))))
        return 0
    if args.batch < 1:
        ap.error(f"--batch must be >= 1 (got {args.batch})")
    bad = [t for t in args.ts if t % 8]
    if bad:
        ap.error(f"--ts {bad}: the Mosaic GPU kernel takes T a multiple of 8 (the engine pads to one)")
    configs = args.configs.split(",")
    triton = tuning_for().kernels.with_impls(attention="pallas")     # at the tile table's tiles for this device
    (hq, hkv, dh), dtype = HEADS, jnp.bfloat16
    rows = []
    for t in args.ts:
        for p in args.prefixes:
            s = p + 512
            ragged = p - 3
            case = make_case(jax.random.key(t + p), bt=args.batch, t=t, s=s, hq=hq, hkv=hkv, dh=dh, dtype=dtype,
                             cache_len=[max(ragged - 3 * i, 0) for i in range(args.batch)], poison=True)
            ref = attention(*case, scale=dh**-0.5, impl="xla")
            timed = timed_case(t, p, args.batch)
            for name in configs:
                cfg = parse_config(name)
                if cfg is None:
                    fn = functools.partial(dispatch.attention, triton, scale=dh**-0.5)
                else:
                    fn = functools.partial(attention_mgpu, scale=dh**-0.5, config=cfg)
                row = dict(t=t, prefix=p, config=name, batch=args.batch)
                try:
                    out = jax.jit(fn)(*case)
                    row["rel_err"] = rel_err(out, ref)
                    row["nan"] = bool(jnp.isnan(out.astype(jnp.float32)).any())
                    tr = trace_chain(fn, timed, inner=args.inner, cold_bytes=args.cold_mb << 20)
                    row.update(busy_us=tr.get("busy_us"), span_us=tr.get("span_us"),
                               launches=tr.get("launches"), kernels_us=tr.get("kernels_us"))
                except Exception as e:  # noqa: BLE001 - a config that fails is reported, not fatal
                    row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with open(os.path.join(args.out, "mgpu.json"), "w") as f:
                        json.dump(rows, f, indent=1)
    if args.out and len(args.prefixes) > 1:
        from bench.plots import mgpu_prefix
        print(f"[bench_mgpu] plot: {mgpu_prefix(rows, os.path.join(args.out, 'mgpu_prefix.png'))}")
    print(f"[bench_mgpu] fastest exact config per T: {json.dumps(fastest(rows))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
