"""Tree-build time alone: the vocabulary top-k and the best-first selection, per budget.

    python3 -m bench.bench_tree --out DIR                 # GPU: Qwen3 vocabulary, depth 15
    python3 -m bench.bench_tree --vocab 4096 --budgets 16,64 --inner 2    # CPU smoke run

Each figure is the median over repeats of a jitted fori_loop of --inner builds (inputs perturbed
per iteration so nothing is hoisted), divided by --inner: device time without dispatch.
`topk` is `lax.top_k(logp, K)` over the vocabulary alone; `topk2` the two-stage variant
(`ddtree.vocab_top_k`, 128 chunks keeping K each); `topk2_keep` the same keeping at most
--keep per chunk (exact fallback to one top_k when a chunk held more; `topk2_keep_fallback`
times that fallback, on logits whose K best tokens share one chunk; these rows keep lax.top_k as
the second stage, which the build replaces up to VOCAB_TOPK's stage2_max_k); `build` the whole
policy build, every array of the DraftTree (ancestor mask included; before session 9 only its
tokens, so XLA dropped the mask's work), with the backend's settings in ddtree.VOCAB_TOPK.
`--trace` (default on a GPU) also traces one loop of each build variant: every kernel's device
time a build, their sum, launches and the span (first kernel start to last kernel end), which
leave out the loop's dispatch.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import re
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import jax
import jax.numpy as jnp

from ddtree_jax.trees import make_policy
from ddtree_jax.trees import base as trees_base
from ddtree_jax.trees import ddtree
from ddtree_jax.trees.ddtree import vocab_top_k


def _loop(fn, inner: int):
    """A jitted fori_loop of `inner` calls of fn on x perturbed per iteration (nothing hoisted)."""
    @jax.jit
    def loop(x):
        def body(i, acc):
            out = fn(x + i.astype(x.dtype) * 1e-9)
            return acc + sum(jnp.sum(o.astype(jnp.float32)) for o in jax.tree_util.tree_leaves(out)) * 0
        return jax.lax.fori_loop(0, inner, body, jnp.float32(0))
    return loop


def timed(fn, x, inner: int, repeats: int) -> float:
    loop = _loop(fn, inner)
    jax.block_until_ready(loop(x))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(loop(x))
        ts.append((time.perf_counter() - t0) / inner)
    return 1e3 * statistics.median(ts)


def traced(fn, x, inner: int) -> dict:
    """One profiled run of timed's loop: per build, the device time of every kernel by name
    (largest first), of all kernels, their launches and the span from the first kernel's start
    to the last one's end (us). Empty where the trace holds no device events."""
    from bench.profile_round import kernel_summary, traced_events

    loop = _loop(fn, inner)
    jax.block_until_ready(loop(x))
    events = traced_events(lambda: jax.block_until_ready(loop(x)))
    return kernel_summary(events, inner)


@contextlib.contextmanager
def _settings_restored():
    """The tree build's per-backend settings (ddtree's tables) as they were on entry, afterwards."""
    with contextlib.ExitStack() as stack:
        for table in (ddtree.RANK_BY_COUNT_MAX, ddtree.VOCAB_TOPK, ddtree.SELECT_BARRIER, ddtree.SELECT_ONEHOT_MAX,
                      ddtree.GLOBAL_PRUNE, ddtree.BEAM_KERNEL_MAX, ddtree.SELECT_TOP_FROM,
                      ddtree.FINAL_MERGE_FROM, ddtree.RANK_KERNEL_FROM, ddtree.PAIR_KERNEL_FROM,
                      ddtree.PAIR_KERNEL_TILE, ddtree.RUNS_KERNEL_FROM, trees_base.ANCESTOR_CHAIN_FROM):
            stack.enter_context(mock.patch.dict(table))
        yield


# The tree build's count thresholds that an option's values compare: (option, row-name part,
# ddtree's table, what a value means).
FROM_OPTIONS = (
    ("--select-top-from", "top", "SELECT_TOP_FROM",
     "a selection of n < P from P candidates keeps its n best by select_top first from this P"),
    ("--final-merge-from", "merge", "FINAL_MERGE_FROM",
     "the final selection by merging the depths' sorted beams from this many entries"),
    ("--rank-kernel-from", "rank", "RANK_KERNEL_FROM", "a selection over P entries runs in the rank_select kernel from this P"),
    ("--pair-kernel-from", "pair", "PAIR_KERNEL_FROM",
     "a depth of P candidates selects in the pair_select kernel from this P"),
    ("--runs-kernel-from", "runs", "RUNS_KERNEL_FROM",
     "the final selection over T entries runs in the runs_select kernel from this T"),
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_tree", description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--budgets", default="16,64,256,1024")
    ap.add_argument("--policy", default="ddtree")
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep", type=int, default=64, help="per-chunk candidates of topk2_keep")
    ap.add_argument("--variants", default="",
                    help="more vocabulary top-k settings to time, CHUNKSxKEEP comma-separated (e.g. "
                         "256x16,1024x8; KEEP 0 = keep K; a trailing p runs the first stage with the "
                         "Pallas extraction kernel, 128x64p, a trailing t with the threshold kernel, "
                         "128x64t, then optionally rBITS and wWARPS for its radix bits and warps, "
                         "128x64tr4w2): rows gain topk_<variant>_ms")
    ap.add_argument("--stage1", default=None,
                    help="the build's first vocabulary top-k stage, as DDTREE_VOCAB_STAGE1 takes it: "
                         "xla, pallas[:wWARPS] or threshold[:rBITSwWARPS] (ddtree.VOCAB_TOPK's stage1; "
                         "default: the backend's setting)")
    ap.add_argument("--count-max", default="1024,0",
                    help="ddtree.RANK_BY_COUNT_MAX values to compare (pairwise ranking vs sort)")
    ap.add_argument("--select-barrier", default="",
                    help="ddtree.SELECT_BARRIER values to compare, e.g. 0,1 (default: the backend's "
                         "setting); rows gain build_ms_countN_barrierB")
    ap.add_argument("--ancestor-impl", default="",
                    help="ancestor-mask constructions to compare at every size, e.g. square,chain "
                         "(trees.base.ANCESTOR_CHAIN_FROM; default: the backend's rule); rows gain "
                         "build_ms_countN[...]_ancI")
    ap.add_argument("--onehot-max", default="",
                    help="ddtree.SELECT_ONEHOT_MAX values to compare, e.g. 0,100000 (a depth's selected "
                         "values by one-hot reductions where n * P is at most this; default: the "
                         "backend's setting); rows gain build_ms_countN[...]_onehotM")
    ap.add_argument("--global-prune", default="",
                    help="ddtree.GLOBAL_PRUNE values to compare, e.g. 0,1 (the exact tree pruned by the "
                         "global budget too; default: the backend's setting); rows gain "
                         "build_ms_countN[...]_pruneP")
    ap.add_argument("--beam-kernel-max", default="",
                    help="ddtree.BEAM_KERNEL_MAX values to compare (largest candidate count a depth for the "
                         "one-kernel depth loop; 0: XLA's ops), e.g. 0,256")
    ap.add_argument("--stage2-max-k", default="",
                    help="ddtree.VOCAB_TOPK stage2_max_k values to compare (the vocabulary top-k's second "
                         "stage by the threshold kernel up to this K; 0: lax.top_k), e.g. 0,64; only where "
                         "the backend has a two-stage top-k")
    ap.add_argument("--stage2-select", default="",
                    help="ddtree.VOCAB_TOPK stage2_select values to compare, e.g. 0,1 (the second stage by "
                         "select_top where stage2_max_k does not cover K); only where the backend has a "
                         "two-stage top-k")
    ap.add_argument("--select-radix", default="",
                    help="radix bits a round of the select second stage's select_top to compare, e.g. 2,4 "
                         "(ddtree.VOCAB_TOPK select_radix_bits); only where the backend has a two-stage top-k")
    for flag, _, table, what in FROM_OPTIONS:
        ap.add_argument(flag, default="", help=f"ddtree.{table} values to compare, e.g. 0,1000 ({what}; 0: never)")
    ap.add_argument("--pair-kernel-tile", default="",
                    help="pair_select launch options to compare, TIxA[wWARPS] comma-separated, e.g. "
                         "32x32w4,16x32w2 (ddtree.PAIR_KERNEL_TILE)")
    ap.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                    help="also trace one loop of each build variant: its kernels by device time and the "
                         "span a build (default: on a GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.trace is None:
        args.trace = jax.default_backend() == "gpu"
    bad = set(filter(None, args.ancestor_impl.split(","))) - set(trees_base.ANCESTOR_IMPLS)
    if bad:
        ap.error(f"--ancestor-impl: {', '.join(sorted(bad))}: choose from {', '.join(trees_base.ANCESTOR_IMPLS)}")
    try:
        stage1 = ddtree.stage1_setting(args.stage1) if args.stage1 else None
    except ValueError as e:
        ap.error(f"--stage1 {args.stage1}: {e}")
    for flag, given in (("--stage2-max-k", args.stage2_max_k), ("--stage2-select", args.stage2_select),
                        ("--select-radix", args.select_radix)):
        if given and not ddtree.VOCAB_TOPK.get(jax.default_backend()):
            ap.error(f"{flag}: the {jax.default_backend()} backend's vocabulary top-k has one stage "
                     "(ddtree.VOCAB_TOPK); leave it out here")
    variants = []
    for v in filter(None, args.variants.lower().split(",")):
        # CHUNKSxKEEP, then p (extraction) or t (threshold) and the options stage1_setting takes
        m = re.fullmatch(r"(\d+)x(\d+)(?:([pt])(.*))?", v)
        try:
            if not m:
                raise ValueError("not CHUNKSxKEEP[p[wWARPS]|t[rBITS][wWARPS]] (e.g. 128x64tr4w2)")
            chunks, keep, tag, opts = m.groups()
            setting = ddtree.stage1_setting(
                {"p": "pallas", "t": "threshold", None: "xla"}[tag] + (f":{opts}" if opts else ""))
        except ValueError as e:
            ap.error(f"--variants {v}: {e}")
        options = {name: x for name, x in setting.items() if name != "stage1"}
        variants.append((v, int(chunks), int(keep), tag or "", options))
    logp = jax.nn.log_softmax(3.0 * jax.random.normal(jax.random.PRNGKey(0), (1, args.depth, args.vocab)), -1)
    policy = make_policy(args.policy)
    rows = []
    for b in [int(x) for x in args.budgets.split(",") if x]:
        k = min(b, args.vocab)
        r = dict(budget=b, k=k)
        r["topk_ms"] = timed(lambda x: jax.lax.top_k(x, k), logp, args.inner, args.repeats)
        r["topk2_ms"] = timed(lambda x: vocab_top_k(x, k, chunks=128), logp, args.inner, args.repeats)
        r["topk2_keep_ms"] = timed(lambda x: vocab_top_k(x, k, chunks=128, keep=args.keep), logp,
                                   args.inner, args.repeats)
        if args.keep < k:  # the worst case: the K best tokens in one chunk force the exact fallback
            clustered = logp.at[:, :, :k].add(100.0)
            r["topk2_keep_fallback_ms"] = timed(lambda x: vocab_top_k(x, k, chunks=128, keep=args.keep),
                                                clustered, args.inner, args.repeats)
        for v in variants:
            chunks, keep, tag, options = v[1:]
            impl = "xla"
            if tag:
                impl = ("pallas" if tag == "p" else "threshold") + (
                    "" if jax.default_backend() == "gpu" else "_interpret")
            r[f"topk_{v[0]}_ms"] = timed(
                lambda x, c=chunks, kp=keep, im=impl, o=options: vocab_top_k(
                    x, k, chunks=c, keep=kp or None, stage1=im, **o),
                logp, args.inner, args.repeats)
        backend = jax.default_backend()
        with _settings_restored():
            topk = ddtree.VOCAB_TOPK.get(backend)
            if args.stage1 and topk:
                # forced at every K (the default rule keeps XLA's sort where a chunk keeps > pallas_keep_max)
                ddtree.VOCAB_TOPK[backend] = dict(topk, **stage1, pallas_keep_max=1 << 30)
            r["stage1"] = ddtree._vocab_top_k_settings(k)[2]
            barriers = [bool(int(x)) for x in args.select_barrier.split(",") if x] or [None]
            ancestors = [x for x in args.ancestor_impl.split(",") if x] or [None]
            onehots = [int(x) for x in args.onehot_max.split(",") if x] or [None]
            prunes = [bool(int(x)) for x in args.global_prune.split(",") if x] or [None]
            beams = [int(x) for x in args.beam_kernel_max.split(",") if x] or [None]
            stage2s = [int(x) for x in args.stage2_max_k.split(",") if x] or [None]
            selects = [bool(int(x)) for x in args.stage2_select.split(",") if x] or [None]
            radixes = [int(x) for x in args.select_radix.split(",") if x] or [None]
            pair_tiles = [x for x in args.pair_kernel_tile.split(",") if x] or [None]
            froms = [[int(x) for x in getattr(args, flag[2:].replace("-", "_")).split(",") if x] or [None]
                     for flag, *_ in FROM_OPTIONS]
            counts = [int(x) for x in args.count_max.split(",") if x]
            # (row-name part, setting table, its value from the option); None: the backend's setting
            for c, bar, anc, oh, gp, bk, s2, sel, rad, pt, *from_values in itertools.product(
                    counts, barriers, ancestors, onehots, prunes, beams, stage2s, selects, radixes, pair_tiles,
                    *froms):
                name = "build_ms"
                if s2 is not None and ddtree.VOCAB_TOPK.get(backend):
                    ddtree.VOCAB_TOPK[backend] = dict(ddtree.VOCAB_TOPK[backend], stage2_max_k=s2)
                if sel is not None and ddtree.VOCAB_TOPK.get(backend):
                    ddtree.VOCAB_TOPK[backend] = dict(ddtree.VOCAB_TOPK[backend], stage2_select=sel)
                if rad is not None and ddtree.VOCAB_TOPK.get(backend):
                    ddtree.VOCAB_TOPK[backend] = dict(ddtree.VOCAB_TOPK[backend], select_radix_bits=rad)
                for part, table, value in (
                        (f"count{c}", ddtree.RANK_BY_COUNT_MAX, c),
                        (f"barrier{int(bool(bar))}", ddtree.SELECT_BARRIER, bar),
                        (f"anc{anc}", trees_base.ANCESTOR_CHAIN_FROM,
                         None if anc is None else trees_base.chain_from_every_size(anc)),
                        (f"onehot{oh}", ddtree.SELECT_ONEHOT_MAX, oh),
                        (f"prune{int(bool(gp))}", ddtree.GLOBAL_PRUNE, gp),
                        (f"beam{bk}", ddtree.BEAM_KERNEL_MAX, bk),
                        *((f"{part}{v}", getattr(ddtree, table), v)
                          for (_, part, table, _), v in zip(FROM_OPTIONS, from_values)),
                        (f"pt{pt}", ddtree.PAIR_KERNEL_TILE, None if pt is None else ddtree.pair_tile_setting(pt))):
                    if value is not None:
                        table[backend] = value
                        name += "_" + part
                if s2 is not None:
                    name += f"_s2max{s2}"
                if sel is not None:
                    name += f"_s2sel{int(sel)}"
                if rad is not None:
                    name += f"_selr{rad}"
                r[name] = timed(lambda x: policy.build(x, b), logp, args.inner, args.repeats)
                if args.trace:
                    t = r[name.replace("build_ms", "build_trace")] = traced(
                        lambda x: policy.build(x, b), logp, args.inner)
                    if t:
                        top = list(t["kernels_us"].items())[:12]
                        print(f"[bench_tree] {args.policy} B={b:5d} {name[9:] or 'default'} by device time: span "
                              f"{t['span_us']:.1f} us a build, kernels {t['busy_us']:.1f} us in {t['launches']:.0f} "
                              "launches; " + ", ".join(f"{k} {us:.1f}" for k, us in top), flush=True)
        rows.append(r)
        builds = ", ".join(f"{k[6:]} {v:.3f}" for k, v in r.items() if k.startswith("build_ms"))
        builds += "".join(f"; {k[:-3]} {v:.3f}" for k, v in r.items() if k.startswith("topk_") and k != "topk_ms")
        print(f"[bench_tree] {args.policy} B={b:5d}: top_k {r['topk_ms']:.3f} ms, two-stage top_k {r['topk2_ms']:.3f} ms "
              f"(keeping {args.keep} a chunk {r['topk2_keep_ms']:.3f}"
              + (f", its fallback {r['topk2_keep_fallback_ms']:.3f}" if "topk2_keep_fallback_ms" in r else "")
              + "), "
              f"whole build (by count limit) {builds} ms", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_tree.json").write_text(json.dumps(
            dict(device=jax.devices()[0].device_kind, jax=jax.__version__, vocab=args.vocab, depth=args.depth,
                 policy=args.policy, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
