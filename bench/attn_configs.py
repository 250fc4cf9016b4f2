"""Verify-attention tiles alone at one prefix, on realistic tree masks.

    python -m bench.attn_configs --ts 257,1025 --prefix 512 \
        --configs 257=table,128x64w8s4n1k0,64x64w4s4n1b64 --trees ddtree,random

Each config is timed in a chain of calls whose caches rotate over >= 160 MB (every call reads
its K/V from HBM, as the layers of a forward do), for each tree kind:

* ``ddtree``: the masks of the DDTree policy on random draft log-probs (``--sigma`` sets how
  peaked they are), the trees the engine verifies, in its slot order;
* ``random``: random recursive trees (parent uniform over the earlier slots), whose ancestors
  spread over the whole tree: the worst case for skipping empty key blocks.

A config is ``BMxBKwWARPSsSTAGES`` plus optional ``nSPLITS`` (prefix parts), ``bBLOCKNEW``
(new keys a step) and ``k0`` / ``k1`` (skip empty new-key steps never / always; without it the
kernel's rule, SKIP_MIN_STEPS), e.g. ``64x64w4s4n1b64k1``;
``table`` is what the engine runs here (the device's tuned entry, else the default tiles).
``--write-table PATH`` writes an attention table (the ``$DDTREE_ATTENTION_TABLE`` format) with
each T's fastest config on the ``ddtree`` trees, for an end-to-end A/B in ``bench.bench_round``.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import re
import sys
import time

import numpy as np

import jax
import jax.numpy as jnp

from bench.bench_kernels import make_case, random_tree_mask, rel_err, time_chain
from ddtree_jax.trees import make_policy
from ddtree_jax.kernels import KernelConfig, attention
from ddtree_jax.kernels.tree_attention import default_config, launch_plan, tuned_attention_config

_SPEC = re.compile(r"(\d+)x(\d+)w(\d+)s(\d+)(?:n(\d+))?(?:b(\d+))?(?:k([01]))?$")
TABLE_FIELDS = ("block_m", "block_k", "num_warps", "num_stages", "num_splits", "block_new",
                "skip_empty")


def parse_config(spec: str, t: int, g: int, dh: int, s: int, kind: str | None) -> KernelConfig:
    """A compact config spec (module docstring) -> KernelConfig; ValueError names the spec."""
    if spec == "table":
        return tuned_attention_config(t, g, dh, s=s, device_kind=kind) or default_config(t, g, dh)
    m = _SPEC.match(spec)
    if not m:
        raise ValueError(f"attention config {spec!r}: write BMxBKwWARPSsSTAGES[nSPLITS][bBLOCKNEW][k0|k1], "
                         "e.g. 64x64w4s4n1b64, or 'table'")
    bm, bk, w, st, n, bn, k = m.groups()
    return dataclasses.replace(default_config(t, g, dh), block_m=int(bm), block_k=int(bk),
                               num_warps=int(w), num_stages=int(st),
                               num_splits=int(n) if n else None, block_new=int(bn) if bn else None,
                               skip_empty=None if k is None else k == "1")


def parse_configs(text: str) -> dict[int, list[str]]:
    """'257=table,64x64w4s4n1;65=table' -> {257: [...], 65: [...]}."""
    out = {}
    for part in filter(None, text.split(";")):
        t, _, specs = part.partition("=")
        if not t.strip().isdigit() or not specs:
            raise ValueError(f"--configs part {part!r}: write T=SPEC,SPEC (parts joined by ';')")
        out[int(t)] = [x for x in specs.split(",") if x]
    return out


def tree_masks(kind: str, t: int, bt: int, seed: int, sigma: float, vocab: int = 512,
               depth: int = 15) -> np.ndarray:
    """bool [bt, t, t] ancestor-or-self masks of `bt` trees of t slots (root included)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return np.stack([random_tree_mask(rng, t) for _ in range(bt)])
    if kind != "ddtree":
        raise ValueError(f"tree kind {kind!r}: choose ddtree or random")
    logits = jnp.asarray(rng.standard_normal((bt, depth, vocab)) * sigma, jnp.float32)
    build = jax.jit(make_policy("ddtree").build, static_argnums=1)
    return np.asarray(build(jax.nn.log_softmax(logits, -1), t - 1).ancestor_mask)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ts", default="257", help="T values (tree slots: budget + 1)")
    ap.add_argument("--prefix", type=int, default=512, help="committed keys (the cache is full)")
    ap.add_argument("--configs", default="", help="T=SPEC,SPEC;T=... (default: table for each T)")
    ap.add_argument("--trees", default="ddtree,random")
    ap.add_argument("--sigma", type=float, default=3.0, help="spread of the random draft logits")
    ap.add_argument("--heads", default="32,8,128", help="HQ,HKV,DH (default: a Qwen3-8B layer)")
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cold-mb", type=int, default=160)
    ap.add_argument("--small", action="store_true", help="CPU smoke run: interpret mode, no timing")
    ap.add_argument("--write-table", default="", help="attention table with each T's fastest config")
    ap.add_argument("--table-s", default="0,3584", help="cache capacities the written entries cover")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no new measurement after this many seconds (0: no limit)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    hq, hkv, dh = (int(x) for x in args.heads.split(","))
    g = hq // hkv
    ts = [int(x) for x in args.ts.split(",") if x]
    specs = parse_configs(args.configs)
    kind = None if args.small else jax.devices()[0].device_kind
    impl = "pallas_interpret" if args.small else "pallas"
    dtype = jnp.float32 if args.small else jnp.bfloat16
    s = args.prefix
    configs = {t: [(sp, parse_config(sp, t, g, dh, s, kind)) for sp in specs.get(t, ["table"])]
               for t in ts}
    rows, best = [], {}
    for t in ts:
        for tree in args.trees.split(","):
            mask = tree_masks(tree, t, 1, seed=t, sigma=args.sigma)
            a = make_case(jax.random.PRNGKey(t), bt=1, t=t, s=s, hq=hq, hkv=hkv, dh=dh, dtype=dtype,
                          new_mask=mask)
            truth = attention(*a, scale=dh ** -0.5, impl="xla")
            for spec, cfg in configs[t]:
                if args.budget_s and time.perf_counter() - t_start > args.budget_s:
                    print(f"[attn_configs] budget spent: T={t} {tree} {spec} and after not run", flush=True)
                    break
                fn = functools.partial(attention, scale=dh ** -0.5, impl=impl, config=cfg)
                out = jax.jit(fn)(*a)
                row = dict(t=t, prefix=s, tree=tree, config=spec, err=rel_err(out, truth),
                           parts=launch_plan(1, t, hkv, g, dh, s, cfg).parts,
                           **{f: getattr(cfg, f) for f in TABLE_FIELDS})
                if not args.small:
                    row["us"] = 1e6 * time_chain(fn, a, inner=args.inner, reps=args.reps,
                                                 cold_bytes=args.cold_mb << 20)
                    if tree == "ddtree" and row["err"] < 2e-2 and (t not in best or row["us"] < best[t][0]):
                        best[t] = (row["us"], cfg)
                rows.append(row)
                print(f"[attn_configs] T={t:5d} P={s} {tree:6s} {spec:22s} parts {row['parts']} "
                      f"err {row['err']:.2e}" + (f"  {row['us']:8.2f} us" if "us" in row else ""), flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attn_configs.json"), "w") as f:
            json.dump(dict(device=kind, heads=[hq, hkv, dh], rows=rows), f, indent=1)
    if args.write_table and best:
        lo, hi = (int(x) for x in args.table_s.split(","))
        entries = [dict(t=[t, t], g=g, dh=dh, s=[lo, hi],
                        config={f: getattr(cfg, f) for f in TABLE_FIELDS})
                   for t, (_, cfg) in sorted(best.items())]
        with open(args.write_table, "w") as f:
            json.dump({kind: entries}, f, indent=1)
        print(f"[attn_configs] table {args.write_table}: " + ", ".join(
            f"T={t} {us:.1f} us" for t, (us, _) in sorted(best.items())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
