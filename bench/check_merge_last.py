"""The attention kernel's two ways of combining split parts, on the device: correctness, run-to-run
determinism and time.

    python3 bench/check_merge_last.py --out DIR            # GPU (compiled, Triton lowering)
    python3 bench/check_merge_last.py --out DIR --small    # CPU smoke run (interpret mode)

``merge="kernel"`` is the shipped path (a second kernel, ddtree_attention_merge); ``merge="last"``
lets the last program of each row block merge, through an atomic ticket. Whether the last
program really sees every other part's stores is a property of the GPU's memory model that no
CPU run can show, so each case here (Qwen3-8B layer shapes: Hq 32, Hkv 8, Dh 128, bf16) checks:

* both paths against the XLA reference (max error relative to the largest output);
* "last" against "kernel" (the same partials, summed in another order: ~1e-3 in bf16);
* ``--repeats`` calls of "last", each bit-identical to the first: its merge order is fixed (part
  0 first), so any difference is a program that read a partial before it was written;
* the time of one call in a chain of ``--inner`` (bench_kernels.time_chain: output -> next q,
  caches rotated over 160 MB so that they come from HBM as in a forward).

Results: DIR/check_merge_last.json and one line per case; the exit status is 1 if any check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from bench.bench_kernels import make_case, rel_err, time_chain  # noqa: E402
from pallas_kernels import attention, default_config  # noqa: E402
from pallas_kernels.tree_attention import launch_plan  # noqa: E402

# (T, prefix): the DDTree-64 / -256 verify at the benchmark's prefix 512 and at 4k, decode at 32k.
CASES = ((65, 512), (65, 4096), (257, 4096), (1, 4096), (1, 32768))
SMALL = ((9, 200), (1, 300))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--small", action="store_true", help="tiny CPU smoke run (interpret mode)")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args(argv)
    small = args.small or jax.default_backend() == "cpu"
    impl = "pallas_interpret" if small else "pallas"
    hq, hkv, dh = (4, 2, 64) if small else (32, 8, 128)
    g = hq // hkv
    dtype = jnp.bfloat16
    os.makedirs(args.out, exist_ok=True)
    rows, ok = [], True
    for t, p in (SMALL if small else CASES):
        case = make_case(jax.random.PRNGKey(t * 7 + p), bt=1, t=t, s=p, hq=hq, hkv=hkv, dh=dh,
                         dtype=dtype)
        base = default_config(t, g, dh)
        plan = launch_plan(1, t, hkv, g, dh, p, base)
        if plan.num_splits == 1:
            base = dataclasses.replace(base, num_splits=2)   # a split is what is checked
            plan = launch_plan(1, t, hkv, g, dh, p, base)
        fns = {m: jax.jit(functools.partial(attention, scale=dh ** -0.5, impl=impl,
                                            config=dataclasses.replace(base, merge=m)))
               for m in ("kernel", "last")}
        ref = attention(*case, scale=dh ** -0.5, impl="xla")
        out = {m: fn(*case) for m, fn in fns.items()}
        first = out["last"]
        repeats = 1 if small else args.repeats
        differing = sum(int(not bool(jnp.array_equal(fns["last"](*case), first)))
                        for _ in range(repeats))
        row = dict(t=t, prefix=p, parts=plan.parts,
                   err_kernel=rel_err(out["kernel"], ref), err_last=rel_err(first, ref),
                   last_vs_kernel=rel_err(first, out["kernel"]), repeats=repeats,
                   differing_repeats=differing,
                   nan=bool(jnp.isnan(first.astype(jnp.float32)).any()))
        if not small:
            for m, fn in fns.items():
                row[f"us_{m}"] = 1e6 * time_chain(fn, case, inner=args.inner, reps=args.reps,
                                                  cold_bytes=160 << 20)
        good = (row["err_last"] < 2e-2 and row["err_kernel"] < 2e-2 and row["last_vs_kernel"] < 2e-2
                and differing == 0 and not row["nan"])
        ok &= good
        rows.append({**row, "ok": good})
        times = (f", us kernel {row['us_kernel']:.2f} last {row['us_last']:.2f}" if not small else "")
        print(f"[check_merge_last] T={t:4d} prefix={p:6d} parts={row['parts']:3d}: err kernel "
              f"{row['err_kernel']:.2e} last {row['err_last']:.2e} (last vs kernel "
              f"{row['last_vs_kernel']:.2e}), {differing}/{repeats} repeats differ"
              f"{times} -> {'ok' if good else 'FAILED'}", flush=True)
        with open(os.path.join(args.out, "check_merge_last.json"), "w") as f:
            json.dump(dict(device=jax.devices()[0].device_kind, rows=rows), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
