"""Verify/decode attention: correctness on the device, tile and split sweeps, then a timing table.

    python -m bench.bench_kernels --out DIR            # GPU: compiled Pallas (Triton lowering)
    python -m bench.bench_kernels --out DIR --small    # CPU smoke run: tiny sizes, interpret mode

Shapes follow a Qwen3-8B layer: Hq=32, Hkv=8, Dh=128, bf16, batch 1; T = B + 1 new tokens
(B = 64 and 256 tree budgets, and T = 1 decode); prefixes 1k..32k.

Timing (``--timing``): ``chain`` (default) jits ``--inner`` calls in a row, each call's output
being the next call's q (the shape matches), like the layers of a forward: no op is added
between calls and XLA can neither hoist nor drop any call; the time of one jitted chain,
median over ``--reps``, divided by ``--inner``. ``loop`` is the older method: a ``fori_loop``
of ``--inner`` calls whose per-iteration overhead (~20 us on an H200, timed alone as
``loop_us``) is included in every time. Floors: bytes = prefix K+V read once / 3.3e12 B/s (the
JAX elementwise copy rate measured on this H200); flops = 4*Hq*T*(P+T)*Dh / 7.9e14 FLOP/s
(measured bf16 matmul rate).

Sweeps: tiles at one long prefix per T (``--tile-prefix``), then the number of prefix splits
(``KernelConfig.num_splits``; 1 = the one-kernel path without the merge kernel) at each
``--split-prefixes`` prefix; both rank by the traced device span where ``--trace`` runs (else by
wall time). The table uses the default heuristic (tiles from the tile sweep
when it ran) and shows how many kernels and splits each call launched; its engine column
(``--engine``, on by default) times what the round runs instead: ``dispatch.attention`` (this
device's "auto") at the engine's verify rows (on Hopper the Mosaic GPU kernel at T = 72 / 264 for B = 64 / 256), over a
cache of the positions generate gives a request of PREFIX prompt tokens (``--engine-new-tokens``
new ones): the kernels' static choices go by the cache's positions, not by the prefix.
Results go to DIR/bench_kernels.json (rewritten after every row) and tables on stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import statistics
import sys
import time
import traceback

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

from bench.bench_round import SHAPES
from ddtree_jax.kernels import KernelConfig, attention, attention_reference, default_config
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels.dispatch import verify_rows
from ddtree_jax.kernels.tree_attention import launch_plan
from ddtree_jax.tuning import tuning_for

# The engine column's drafter depth (generate.cache_positions): the 8B pair's block less its root.
DRAFT_DEPTH = SHAPES["qwen3-8b"]["drafter"]["block_size"] - 1
HBM_BPS = 3.3e12
MMA_FLOPS = 7.9e14
# float32: the H200's FP32 (FMA) rate from its data sheet, not measured: a conservative floor
# for the kernel's TF32x3 products.
F32_FLOPS = 6.7e13


def now_s():
    return time.perf_counter()


def int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


# ----------------------------------------------------------------------------- inputs

def random_tree_mask(rng, t: int) -> np.ndarray:
    """Ancestor-or-self mask [t, t] of a random recursive tree (slot i's parent uniform over the
    earlier slots), whose ancestors spread over the whole tree."""
    m = np.eye(t, dtype=bool)
    for i in range(1, t):
        m[i] |= m[rng.integers(0, i)]
    return m


def make_case(key, *, bt, t, s, hq, hkv, dh, dtype, cache_len=None, poison=False, tree=True,
              new_mask=None):
    """One call's inputs; new_mask (bool [bt, t, t]) replaces the random trees (tree=True) or
    the causal masks."""
    ks = jax.random.split(key, 6)
    q = jax.random.normal(ks[0], (bt, t, hq, dh), jnp.float32).astype(dtype)
    k_new = jax.random.normal(ks[1], (bt, t, hkv, dh), jnp.float32).astype(dtype)
    v_new = jax.random.normal(ks[2], (bt, t, hkv, dh), jnp.float32).astype(dtype)
    k_cache = jax.random.normal(ks[3], (bt, hkv, s, dh), jnp.float32).astype(dtype)
    v_cache = jax.random.normal(ks[4], (bt, hkv, s, dh), jnp.float32).astype(dtype)
    cache_len = jnp.full((bt,), s, jnp.int32) if cache_len is None else jnp.asarray(
        cache_len, jnp.int32)
    if poison:
        stale = jnp.arange(s)[None, None, :, None] >= cache_len[:, None, None, None]
        k_cache = jnp.where(stale, jnp.nan, k_cache).astype(dtype)
        v_cache = jnp.where(stale, jnp.nan, v_cache).astype(dtype)
    if new_mask is None:
        rng = np.random.default_rng(int(jax.random.randint(ks[5], (), 0, 2**30)))
        new_mask = np.stack([random_tree_mask(rng, t) if tree else np.tril(np.ones((t, t), bool))
                             for _ in range(bt)])
    return (q, k_new, v_new, k_cache, v_cache, cache_len, jnp.asarray(new_mask))


def rel_err(a, b):
    a = jnp.asarray(a, jnp.float32)
    b = jnp.asarray(b, jnp.float32)
    return float(jnp.abs(a - b).max() / jnp.maximum(jnp.abs(b).max(), 1e-30))


# ----------------------------------------------------------------------------- timing

def _chain(fn, args, *, inner, cold_bytes=0):
    """(jitted, its args): `inner` calls of fn in one jit, output -> next q, rotating over
    copies of the K/V cache (args 3 and 4) that hold at least cold_bytes (see time_chain)."""
    kv = args[3].nbytes + args[4].nbytes
    copies = max(1, min(inner, -(-cold_bytes // max(kv, 1)))) if cold_bytes else 1
    ks = [args[3]] + [jnp.copy(args[3]) for _ in range(copies - 1)]
    vs = [args[4]] + [jnp.copy(args[4]) for _ in range(copies - 1)]

    @jax.jit
    def chained(q, k_new, v_new, ks, vs, cache_len, new_mask):
        for i in range(inner):
            q = fn(q, k_new, v_new, ks[i % copies], vs[i % copies], cache_len,
                   new_mask).astype(q.dtype)
        return q

    return chained, (args[0], args[1], args[2], ks, vs, *args[5:])


def time_chain(fn, args, *, inner, reps, cold_bytes=0):
    """Median seconds per call of fn(*args): `inner` calls in one jit, output -> next q.

    cold_bytes > 0: the calls rotate over copies of the K/V cache (args 3 and 4) that together
    hold at least that many bytes (at most `inner` copies), as the layers of a forward each read
    their own cache; otherwise every call re-reads one cache, which stays in L2 (50 MB on an
    H100/H200) up to ~8k keys of an 8B layer and then beats the HBM floor.
    """
    chained, cargs = _chain(fn, args, inner=inner, cold_bytes=cold_bytes)
    return median_call_s(chained, cargs, inner=inner, reps=reps)


def trace_chain(fn, args, *, inner, cold_bytes=0) -> dict:
    """One traced run of time_chain's chain: per call, the device time of each kernel name
    (summed over its launches), all kernels together, and the span from the first kernel's
    start to the last one's end (kernels + the gaps between them), in us."""
    from bench.profile_round import kernel_summary, traced_events  # the round profiles' trace reader

    chained, cargs = _chain(fn, args, inner=inner, cold_bytes=cold_bytes)
    jax.block_until_ready(chained(*cargs))
    events = traced_events(lambda: jax.block_until_ready(chained(*cargs)))
    return kernel_summary(events, inner)


def time_looped(fn, args, *, inner, reps):
    """Median seconds per call of fn(*args), from a jitted fori_loop of `inner` calls.

    The loop carries a data dependency (out != out is 0 unless NaN) into q and cache_len, so
    XLA can neither hoist any part of the call out of the loop nor fold it away. The q + 0 add
    is one small elementwise op per call, counted in every implementation alike.
    """

    @jax.jit
    def looped(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask):
        def body(_, carry):
            out = fn(q + carry.astype(q.dtype), k_new, v_new, k_cache, v_cache,
                     cache_len + carry, new_mask)
            o0 = out[0, 0, 0, 0]
            return carry + (o0 != o0).astype(jnp.int32)
        return lax.fori_loop(0, inner, body, jnp.zeros((), jnp.int32))

    return median_call_s(looped, args, inner=inner, reps=reps)


def median_call_s(jitted, args, *, inner, reps):
    """Median seconds per inner call of a jitted function that runs `inner` calls (after a
    compile and a warm-up run)."""
    jax.block_until_ready(jitted(*args))
    jax.block_until_ready(jitted(*args))
    times = []
    for _ in range(reps):
        t0 = now_s()
        jax.block_until_ready(jitted(*args))
        times.append((now_s() - t0) / inner)
    return statistics.median(times)


def floors(t, p, hq, hkv, dh, itemsize, bt=1):
    kv_bytes = 2 * bt * hkv * p * dh * itemsize
    flops = 4 * bt * hq * t * (p + t) * dh
    rate = F32_FLOPS if itemsize == 4 else MMA_FLOPS
    return kv_bytes / HBM_BPS, flops / rate, kv_bytes, flops


# ----------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_kernels", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".")
    ap.add_argument("--small", action="store_true", help="tiny CPU smoke run (interpret mode)")
    ap.add_argument("--budget-s", type=float, default=255.0,
                    help="stop starting new measurements after this many seconds")
    ap.add_argument("--timing", choices=("chain", "loop"), default="chain")
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--cold-mb", type=float, default=None,
                    help="chain timing: rotate over K/V copies of at least this many MB so that "
                         "each call reads its cache from HBM, not L2 (default 160 on a GPU, 0 = "
                         "one cache re-read by every call)")
    ap.add_argument("--t-splits", action="append", default=[],
                    help="per-T split sweep values, T=LIST (e.g. 1=32,64,128); overrides --splits")
    ap.add_argument("--no-table", action="store_true", help="skip the timing table")
    ap.add_argument("--heads", default=None,
                    help="HQ,HKV,DH of the sweeps and table (default 32,8,128: a Qwen3-8B layer)")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                    help="dtype of the sweeps and table (float32 runs the kernel's TF32x3 products)")
    ap.add_argument("--ts", type=int_list, default=None, help="T values, e.g. 1,65,257")
    ap.add_argument("--prefixes", type=int_list, default=None,
                    help="table prefixes, e.g. 1024,4096,16384")
    ap.add_argument("--extra", action=argparse.BooleanOptionalAction, default=True,
                    help="table rows for T = 64 and 256 (whole row tiles)")
    ap.add_argument("--tile-prefix", type=int, default=None,
                    help="prefix of the tile sweep (default 16384); 0 skips it")
    ap.add_argument("--split-prefixes", type=int_list, default=None,
                    help="prefixes of the num_splits sweep (default 1024,4096); empty skips it")
    ap.add_argument("--splits", type=int_list, default=None,
                    help="num_splits values of the split sweep (default 1,2,4,8,16,32,64)")
    ap.add_argument("--no-correctness", action="store_true",
                    help="skip the on-device correctness stage (its compiles can take a short step's budget)")
    ap.add_argument("--no-sweep", action="store_true", help="no tile or split sweep")
    ap.add_argument("--sweep-rows", default=None,
                    help="only these rows of each T's tile list, by position (e.g. 0,2,3), in "
                         "the order given: an A/B of a few tiles, repeated as often as listed; "
                         "positions past a T's list are skipped")
    ap.add_argument("--no-xla", action="store_true", help="skip the XLA reference timings")
    ap.add_argument("--no-cudnn", action="store_true", help="skip the cuDNN timings")
    ap.add_argument("--engine", action=argparse.BooleanOptionalAction, default=True,
                    help="table: also time what the round runs, attention(impl=\"auto\") at the "
                         "engine's verify rows (T padded to 8 where that takes the Mosaic GPU "
                         "kernel; padding rows see only themselves); the floors stay the T rows'")
    ap.add_argument("--engine-new-tokens", type=int, default=512,
                    help="the engine column's cache has the positions generate gives a request of "
                         "PREFIX prompt tokens and this many new ones (generate.cache_positions; "
                         "the kernels' static choices go by them), PREFIX of them committed")
    ap.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                    help="also trace one chained run of the kernel (chain timing; table and split "
                         "sweep) and report each kernel's device time per call, their sum and the "
                         "span with gaps; %%dev is the bytes floor over that span (default: on a GPU; "
                         "the wall time per call carries the jitted call's dispatch, ~9 us a call at "
                         "--inner 20 on the H200)")
    args = ap.parse_args(argv)
    t_start = now_s()

    def left():
        return args.budget_s - (now_s() - t_start)

    dev = jax.devices()[0]
    kernels = tuning_for(dev).kernels     # what the engine's "auto" runs here
    on_gpu = dev.platform == "gpu"
    kimpl = "pallas" if on_gpu else "pallas_interpret"
    if args.small:
        hq, hkv, dh = 8, 2, 64
        prefixes, ts = [64, 200], [1, 9]
        tile_p, split_ps, splits = 200, [200], [1, 2, 3]
        args.inner, args.reps = 2, 2
    else:
        hq, hkv, dh = 32, 8, 128
        prefixes, ts = [1024, 4096, 8192, 16384, 32768], [1, 65, 257]
        tile_p, split_ps, splits = 16384, [1024, 4096], [1, 2, 4, 8, 16, 32, 64]
    if args.heads:
        hq, hkv, dh = int_list(args.heads)
    table_dtype = jnp.dtype(args.dtype)
    prefixes = args.prefixes or prefixes
    ts = args.ts or ts
    tile_p = tile_p if args.tile_prefix is None else args.tile_prefix
    split_ps = split_ps if args.split_prefixes is None else args.split_prefixes
    splits = args.splits or splits
    if args.no_sweep:
        tile_p, split_ps = 0, []
    if args.cold_mb is None:
        args.cold_mb = 160.0 if on_gpu else 0.0
    if args.trace is None:
        args.trace = on_gpu
    tracing = args.trace and args.timing == "chain"   # the trace reruns time_chain's chain
    cold = int(args.cold_mb * 1e6)
    timer = (functools.partial(time_chain, cold_bytes=cold) if args.timing == "chain"
             else time_looped)
    t_splits = {}
    for spec in args.t_splits:
        t_, _, values = spec.partition("=")
        t_splits[int(t_)] = int_list(values)
    info = dict(
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        jax=jax.__version__, device=dev.device_kind, platform=dev.platform,
        compute_capability=getattr(dev, "compute_capability", None), auto_impl=kernels.auto_attention,
        kernel_impl=kimpl, small=args.small, timing=args.timing, inner=args.inner,
        reps=args.reps, cold_mb=args.cold_mb, heads=[hq, hkv, dh], dtype=args.dtype,
        hbm_Bps=HBM_BPS, mma_flops=MMA_FLOPS, f32_flops=F32_FLOPS,
        argv=sys.argv[1:] if argv is None else list(argv))
    print(json.dumps(info), flush=True)
    result = dict(info=info, correctness=[], sweep=[], split_sweep=[], table=[], errors=[])
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "bench_kernels.json")

    def dump():
        with open(out_path, "w") as f:
            json.dump(result, f, indent=1)

    g = hq // hkv
    scale = dh ** -0.5
    key = jax.random.PRNGKey(0)

    def plan_of(t, p, cfg):
        pl_ = launch_plan(1, t, hkv, g, dh, p, cfg)
        return dict(kernels=pl_.kernels, splits=pl_.num_splits)

    # ---- 1. correctness on this device: kernel vs XLA reference (f32 reference as truth).
    # Both paths: one kernel (num_splits=1, also on a long prefix) and the merged one.
    one = dict(num_splits=1)
    corr_cases = [
        dict(bt=2, t=1, s=4103, dtype=jnp.bfloat16, cache_len=(4103, 1000)),
        dict(bt=2, t=1, s=4103, dtype=jnp.bfloat16, cache_len=(4103, 1000), cfg=one),
        dict(bt=2, t=65, s=5000, dtype=jnp.bfloat16, cache_len=(4999, 0), poison=True),
        dict(bt=2, t=65, s=5000, dtype=jnp.bfloat16, cache_len=(4999, 0), poison=True, cfg=one),
        dict(bt=1, t=257, s=2048, dtype=jnp.bfloat16, cache_len=(1500,), poison=True),
        dict(bt=2, t=16, s=777, dtype=jnp.float32, cache_len=(777, 300), poison=True,
             kv_start=(500, 0)),
        dict(bt=1, t=65, s=300, dtype=jnp.float32, cache_len=(1,), tree=False),
        dict(bt=1, t=65, s=0, dtype=jnp.bfloat16, cache_len=(0,)),
    ]
    if args.small:
        corr_cases = [dict(bt=2, t=9, s=100, dtype=jnp.float32, cache_len=(100, 7), poison=True),
                      dict(bt=2, t=9, s=100, dtype=jnp.float32, cache_len=(100, 7),
                           kv_start=(60, 0), cfg=dict(num_splits=3)),
                      dict(bt=1, t=4, s=70, dtype=jnp.bfloat16, cache_len=(33,))]
    if args.no_correctness:
        corr_cases = []
    for i, c in enumerate(corr_cases):
        c = dict(c)
        dtype = c.pop("dtype")
        cfg_kw = c.pop("cfg", None)
        starts = c.pop("kv_start", None)
        a = make_case(jax.random.fold_in(key, i), hq=hq, hkv=hkv, dh=dh, dtype=dtype, **c)
        ks = None if starts is None else jnp.asarray(starts, jnp.int32)
        a32 = tuple(x.astype(jnp.float32) if x.dtype == dtype else x for x in a)
        truth = jax.jit(lambda *x: attention_reference(*x, scale=scale, kv_start=ks))(*a32)
        base = default_config(c["t"], g, dh, jnp.dtype(dtype).itemsize)  # what attention() takes
        cfg = dataclasses.replace(base, **cfg_kw) if cfg_kw else None
        row = dict(case={**c, "dtype": jnp.dtype(dtype).name, "kv_start": starts,
                         "config": cfg_kw},
                   plan=plan_of(c["t"], c["s"], cfg or base))
        for impl in ("xla", kimpl):
            try:
                o = jax.jit(lambda *x, impl=impl: attention(*x, scale=scale, impl=impl,
                                                            kv_start=ks, config=cfg))(*a)
                row[impl] = dict(rel_err=rel_err(o, truth),
                                 nan=bool(jnp.isnan(o.astype(jnp.float32)).any()))
            except Exception as e:  # report, keep going
                row[impl] = dict(error=f"{type(e).__name__}: {str(e)[:2000]}")
                traceback.print_exc()
        tol = 1e-5 if dtype == jnp.float32 else 1e-2
        row["ok"] = all("rel_err" in row[m] and row[m]["rel_err"] < tol and not row[m]["nan"]
                        for m in ("xla", kimpl))
        result["correctness"].append(row)
        print("correctness", json.dumps(row), flush=True)
        dump()
    kernel_ok = all(r["ok"] for r in result["correctness"])
    if not kernel_ok:
        print("KERNEL CORRECTNESS FAILED: timings below are for information only", flush=True)

    def _cost(row):
        """What the sweeps rank by: the traced device span where there is one (the wall time of a
        chain carries ~9 us a call of dispatch), else the wall time (us)."""
        return (row.get("trace") or {}).get("span_us", row["us"])

    def measure(t, p, cfg, trace=False):
        """Seconds a call, and (trace) the traced chain's figures, on one case's inputs."""
        a = make_case(jax.random.fold_in(key, 100 + t * 7 + p), bt=1, t=t, s=p, hq=hq, hkv=hkv,
                      dh=dh, dtype=table_dtype)
        fn = lambda *x, cfg=cfg: attention(*x, scale=scale, impl=kimpl, config=cfg)  # noqa: E731
        sec = timer(fn, a, inner=args.inner, reps=max(3, args.reps // 2))
        return sec, (trace_chain(fn, a, inner=args.inner, cold_bytes=cold) if trace else None)

    # ---- 2. tile sweep at one prefix per T
    if args.small:
        sweep_cfgs = {1: [KernelConfig(block_m=16, block_k=32)],
                      9: [KernelConfig(block_m=16, block_k=32), KernelConfig(block_m=32)]}
    else:
        kc = KernelConfig
        dec = functools.partial(dataclasses.replace, default_config(1, g, dh))  # decode's chunk rule
        sweep_cfgs = {
            # Row 0 is the default (32 chunks on 2 warps and 3 stages), which none of the others
            # beat: more or fewer programs, 1-4 stages (a 4-stage 64-key K + V ring is 128 KB of
            # shared memory: one program an SM), 32-key blocks, the merge's tile. An A/B of the
            # default against another row: --sweep-rows 0,N,0,N.
            1: [dec(num_warps=2, num_stages=3), dec(num_warps=4, num_stages=4),
                dec(num_warps=4, num_stages=3),
                dec(target_programs=512, num_warps=4, num_stages=4),
                dec(target_programs=512, num_warps=4, num_stages=2),
                dec(target_programs=512, num_warps=4, num_stages=1),
                dec(target_programs=512, num_warps=2, num_stages=2),
                dec(target_programs=512, num_warps=2, num_stages=1),
                dec(target_programs=512, num_warps=4, num_stages=2, block_k=32),
                dec(target_programs=1024, min_chunk=32, block_k=32, num_warps=4, num_stages=2),
                dec(target_programs=1024, min_chunk=32, block_k=32, num_warps=2, num_stages=1),
                dec(num_warps=2, num_stages=4, merge_tile=1024),
                dec(target_programs=512, num_warps=4, num_stages=2, merge_tile=1024),
                dec(num_warps=2, num_stages=4),
                # The merge's programs: its tile over the parts (rounded up to a power of two)
                # sets the columns a program takes.
                dec(num_warps=2, num_stages=3, merge_tile=4096),
                dec(num_warps=2, num_stages=3, merge_tile=1024),
                dec(num_warps=2, num_stages=3, merge_tile=512)],
            65: [kc(64, 64, 4, 3), kc(64, 64, 4, 4), kc(128, 64, 8, 3), kc(64, 128, 4, 3),
                 kc(64, 64, 4, 3, block_new=64)],
            257: [kc(128, 128, 8, 3), kc(128, 64, 8, 3), kc(128, 64, 8, 4), kc(64, 64, 4, 3),
                  kc(128, 128, 8, 3, block_new=64)],
        }
    best = {t: default_config(t, g, dh, table_dtype.itemsize) for t in ts}
    row_secs = []  # each sweep row's seconds (compile and timing), for the budget guard
    if tile_p and kernel_ok:
        for t in ts:
            best_t = None
            cfgs = sweep_cfgs.get(t, [])
            if args.sweep_rows:
                cfgs = [cfgs[int(i)] for i in args.sweep_rows.split(",") if int(i) < len(cfgs)]
            for cfg in cfgs:
                # Stop where the slowest row so far (a compile and its timing; 20 s before the
                # first) would not fit.
                if left() < 1.5 * max(row_secs, default=20.0):
                    break
                row = dict(t=t, prefix=tile_p, config=dataclasses.asdict(cfg),
                           **plan_of(t, tile_p, cfg))
                row_t0 = now_s()
                try:
                    sec, row["trace"] = measure(t, tile_p, cfg, trace=tracing)
                    row["us"] = sec * 1e6
                    cost = _cost(row)
                    if best_t is None or cost < best_t[0]:
                        best_t = (cost, cfg)
                except Exception as e:
                    row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                row_secs.append(now_s() - row_t0)
                result["sweep"].append(row)
                print("sweep", json.dumps(row), flush=True)
                dump()
            if best_t is not None:
                best[t] = best_t[1]
    result["best_config"] = {str(t): dataclasses.asdict(c) for t, c in best.items()}

    # ---- 3. split sweep: one kernel (num_splits=1) against the merged path, per prefix
    split_best = {}
    if split_ps and kernel_ok:
        print(f"{'T':>4} {'prefix':>7} {'splits':>6} {'kernels':>7} {'us':>8}", flush=True)
        for t in ts:
            for p in split_ps:
                for n in t_splits.get(t, splits):
                    if left() < 45:
                        break
                    if n > 1 and p // n < 64:
                        continue
                    cfg = dataclasses.replace(best[t], num_splits=n)
                    row = dict(t=t, prefix=p, num_splits=n, **plan_of(t, p, cfg))
                    try:
                        sec, row["trace"] = measure(t, p, cfg, trace=tracing)
                        row["us"] = sec * 1e6
                        if (t, p) not in split_best or _cost(row) < split_best[(t, p)][1]:
                            split_best[(t, p)] = (n, _cost(row))
                    except Exception as e:
                        row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                    result["split_sweep"].append(row)
                    dump()
                    us = f"{row['us']:8.1f}" if "us" in row else f"{'error':>8}"
                    span = (f"   device span {row['trace']['span_us']:.1f} us"
                            if row.get("trace") else "")
                    print(f"{t:>4} {p:>7} {n:>6} {row['kernels']:>7} {us}{span}", flush=True)
                default_n = launch_plan(1, t, hkv, g, dh, p, best[t]).num_splits
                if (t, p) in split_best:
                    print(f"     T={t} prefix={p}: best num_splits={split_best[(t, p)][0]}, "
                          f"default heuristic picks {default_n}", flush=True)
    result["split_best"] = {f"{t}/{p}": n for (t, p), (n, _) in split_best.items()}

    # ---- 4. timing table
    def dpa_fn(impl):
        def fn(q, k_new, v_new, k_full, v_full, cache_len, mask_full):
            return jax.nn.dot_product_attention(q, k_full, v_full, mask=mask_full, scale=scale,
                                                implementation=impl)
        return fn

    def engine_row(row, t, p, a):
        """row["engine_*"]: dispatch.attention as the round calls it ("auto"), at verify_rows' rows
        (engine.pad_verify_rows: padding rows see only themselves), over a cache of the positions
        generate gives a request of p prompt tokens and --engine-new-tokens new ones (a tree of
        t - 1 nodes from a 16-token block), p of them committed; the tree is the row's (a)."""
        from ddtree_jax.engine import pad_verify_rows
        from ddtree_jax.generator import cache_positions

        s_eng = cache_positions(p, args.engine_new_tokens, t - 1, DRAFT_DEPTH if t > 1 else 0)[0]
        tp = verify_rows(kernels, t, hq, hkv, dh, table_dtype, cache_size=s_eng, batch=1)
        mask = a[6]
        if tp != t:
            ids = jnp.zeros((1, t), jnp.int32)       # tokens and positions: only the mask is used
            _, _, mask = pad_verify_rows(ids, ids, mask, tp)
        a_eng = make_case(jax.random.fold_in(key, 2000 * t + p), bt=1, t=tp, s=s_eng, hq=hq, hkv=hkv,
                          dh=dh, dtype=table_dtype, cache_len=(p,), new_mask=mask)
        choice = dispatch.attention_choice(kernels, a_eng[0], a_eng[3])[0]
        row.update(engine_rows=tp, engine_impl=choice, engine_cache=s_eng)
        fn = lambda *x: dispatch.attention(kernels, *x, scale=scale)  # noqa: E731
        try:
            row["engine_us"] = timer(fn, a_eng, inner=args.inner, reps=args.reps) * 1e6
            if tracing:
                row["engine_trace"] = trace_chain(fn, a_eng, inner=args.inner, cold_bytes=cold)
        except Exception as e:
            row["engine_error"] = f"{type(e).__name__}: {str(e)[:600]}"
        # The device span where traced, else the wall time a call.
        if row.get("engine_trace"):
            row["engine_span_us"] = row["engine_trace"]["span_us"]
        elif "engine_us" in row:
            row["engine_span_us"] = row["engine_us"]

    header = (f"{'T':>4} {'prefix':>7} {'kern':>4} {'splits':>6} {'bytes_us':>9} "
              f"{'flops_us':>9} {'pallas_us':>10} {'%bytes':>7} {'%roof':>6} "
              f"{'xla_us':>8} {'cudnn_us':>9} {'dev_us':>7} {'%dev':>5}"
              + (f" {'engine (rows, cache)':>22} {'eng_us':>7} {'%bytes':>6} {'%roof':>5}" if args.engine else "")
              + (f" {'loop_us':>8}" if args.timing == "loop" else ""))
    print(header, flush=True)
    # Extra rows: T a multiple of 16 (B = 63, 255) folds into whole row tiles (no padding).
    extra = [] if args.small or not args.extra else [
        (tt, p) for tt, p in [(64, 4096), (64, 32768), (256, 4096), (256, 32768)]
        if tt + 1 in ts and p in prefixes]
    cfg_for = {**best, 64: best.get(65), 256: best.get(257)}
    loop_us = {}
    for t, p in [] if args.no_table else [(t, p) for t in ts for p in prefixes] + extra:
        if left() < 15:
            result["errors"].append(f"budget: skipped T={t} prefix={p} and later")
            break
        cfg = cfg_for[t] or default_config(t, g, dh, table_dtype.itemsize)
        a = make_case(jax.random.fold_in(key, 1000 * t + p), bt=1, t=t, s=p, hq=hq,
                      hkv=hkv, dh=dh, dtype=table_dtype)
        f_bytes, f_flops, kv_bytes, flops = floors(t, p, hq, hkv, dh, table_dtype.itemsize)
        row = dict(t=t, b=t - 1, prefix=p, kv_bytes=kv_bytes, flops=flops,
                   bytes_floor_us=f_bytes * 1e6, flops_floor_us=f_flops * 1e6,
                   config=dataclasses.asdict(cfg), **plan_of(t, p, cfg))
        if args.timing == "loop":
            if t not in loop_us:  # the loop's own cost: q + 0, the NaN check, the loop
                loop_us[t] = time_looped(lambda q, *rest: q, a, inner=args.inner,
                                         reps=args.reps) * 1e6
            row["loop_us"] = loop_us[t]
        impls = {"pallas": lambda *x, cfg=cfg: attention(*x, scale=scale, impl=kimpl,
                                                         config=cfg)}
        if not args.no_xla:
            impls["xla"] = lambda *x: attention(*x, scale=scale, impl="xla")
        for name, fn in impls.items():
            try:
                row[name + "_us"] = timer(fn, a, inner=args.inner, reps=args.reps) * 1e6
            except Exception as e:
                row[name + "_error"] = f"{type(e).__name__}: {str(e)[:600]}"
        if on_gpu and not args.no_cudnn:
            q, k_new, v_new, k_cache, v_cache, cache_len, new_mask = a
            k_full = jnp.concatenate([k_cache.transpose(0, 2, 1, 3), k_new], axis=1)
            v_full = jnp.concatenate([v_cache.transpose(0, 2, 1, 3), v_new], axis=1)
            mask_full = jnp.concatenate([jnp.ones((1, t, p), bool), new_mask], axis=2)[:, None]
            a_full = (q, k_new, v_new, k_full, v_full, cache_len, mask_full)
            try:
                row["cudnn_us"] = timer(dpa_fn("cudnn"), a_full, inner=args.inner,
                                        reps=args.reps) * 1e6
            except Exception as e:
                row["cudnn_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        if tracing and "pallas_us" in row:
            try:
                row["trace"] = trace_chain(impls["pallas"], a, inner=args.inner, cold_bytes=cold)
            except Exception as e:
                row["trace_error"] = f"{type(e).__name__}: {str(e)[:400]}"
        if args.engine:
            engine_row(row, t, p, a)
        roof = max(row["bytes_floor_us"], row["flops_floor_us"])
        if "engine_span_us" in row:
            row["pct_of_bytes_floor_engine"] = 100 * row["bytes_floor_us"] / row["engine_span_us"]
            row["pct_of_roofline_engine"] = 100 * roof / row["engine_span_us"]
        if row.get("trace"):
            row["device_span_us"] = row["trace"]["span_us"]
            row["pct_of_bytes_floor_device"] = 100 * row["bytes_floor_us"] / row["device_span_us"]
        if "pallas_us" in row:
            row["pct_of_bytes_floor"] = 100 * row["bytes_floor_us"] / row["pallas_us"]
            row["pct_of_roofline"] = 100 * roof / row["pallas_us"]
            if "loop_us" in row:
                row["pallas_net_us"] = row["pallas_us"] - row["loop_us"]
                row["pct_of_bytes_floor_net"] = 100 * row["bytes_floor_us"] / row["pallas_net_us"]
                row["pct_of_roofline_net"] = 100 * roof / row["pallas_net_us"]
        result["table"].append(row)
        dump()

        def f(k, w=9, d=1):
            v = row.get(k)
            return f"{v:>{w}.{d}f}" if isinstance(v, float) else f"{'-':>{w}}"
        engine_col = f"{row.get('engine_impl', '-')} ({row.get('engine_rows', '-')}, {row.get('engine_cache', '-')})"
        print(f"{t:>4} {p:>7} {row['kernels']:>4} {row['splits']:>6} {f('bytes_floor_us')} "
              f"{f('flops_floor_us')} {f('pallas_us', 10)} "
              f"{f('pct_of_bytes_floor', 7)} {f('pct_of_roofline', 6)} "
              f"{f('xla_us', 8)} {f('cudnn_us')} "
              f"{f('device_span_us', 7)} "
              f"{f('pct_of_bytes_floor_device', 5, 0)}"
              + (f" {engine_col:>22} "
                 f"{f('engine_span_us', 7)} {f('pct_of_bytes_floor_engine', 6, 0)} "
                 f"{f('pct_of_roofline_engine', 5, 0)}" if args.engine else "")
              + (f" {f('loop_us', 8)}" if args.timing == "loop" else ""), flush=True)
        if row.get("trace"):
            tr = row["trace"]
            print(f"     trace, us a call: span {tr['span_us']:.1f}, kernels {tr['busy_us']:.1f} "
                  f"({tr['launches']:.1f} launches): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in list(tr["kernels_us"].items())[:6]), flush=True)
        for k, v in row.items():
            if k.endswith("_error"):
                print(f"     {k}: {v[:300]}", flush=True)
    if args.timing == "chain":
        print("times are per call in a jitted chain of --inner calls (each output is the next "
              "q; nothing else runs between calls); kern = pallas_calls per call (2: with the "
              "merge kernel), splits = prefix chunks.", flush=True)
    else:
        print("times are per call inside a jitted loop (upper bounds); loop_us is the loop alone "
              "(it partly overlaps GPU work, so time - loop_us, stored as *_net_us, is a lower "
              "bound); %bytes and %roof use the upper bound.", flush=True)
    result["elapsed_s"] = now_s() - t_start
    dump()
    print(f"done in {result['elapsed_s']:.0f}s; wrote {out_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
