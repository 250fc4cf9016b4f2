"""Tree-build time alone: the vocabulary top-k and the best-first selection, per budget.

    python3 -m bench.bench_tree --out DIR                 # GPU: Qwen3 vocabulary, depth 15
    python3 -m bench.bench_tree --vocab 4096 --budgets 16,64 --inner 2    # CPU smoke run
    python3 -m bench.bench_tree --vary rank_by_count_max=0,8192 --vary vocab_topk.stage2_max_k=0,64

Each figure is the median over repeats of a jitted fori_loop of --inner builds (inputs perturbed
per iteration so nothing is hoisted), divided by --inner: device time without dispatch.
`topk` is `lax.top_k(logp, K)` over the vocabulary alone; `topk_tuned` the vocabulary top-k as
the tuning runs it (`ddtree.tuned_vocab_top_k`: on GPUs the threshold kernel's first stage and
its second stage); `topk2` the two-stage variant with XLA's stages (128 chunks keeping K each);
`topk2_keep` the same keeping at most --keep per chunk (exact fallback to one top_k when a chunk
held more; `topk2_keep_fallback` times that fallback, on logits whose K best tokens share one
chunk); `build` the whole policy build, every array of the DraftTree (ancestor mask included).

The build runs with a `TreeTuning` (`ddtree_jax.tuning`): --tuning gpu (GPU_TREE; off a GPU its
kernels interpreted), cpu (the default TreeTuning) or device (this device's, the default), with
--set FIELD=VALUE overrides; each --vary FIELD=V1,V2,... times one build per value (the product
over several --vary), in rows build_ms_FIELDVALUE... FIELD is a TreeTuning field or
vocab_topk.FIELD (a VocabTopK field); values: integers, 0 / 1 for flags, TIxAxWARPS for
pair_kernel_tile, none for vocab_topk (one lax.top_k).
`--trace` (default on a GPU) also traces one loop of each build variant: every kernel's device
time a build, their sum, launches and the span (first kernel start to last kernel end), which
leave out the loop's dispatch.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import re
import statistics
import sys
import time
import typing
from pathlib import Path

import jax
import jax.numpy as jnp

from ddtree_jax.trees import make_policy
from ddtree_jax.trees.ddtree import tuned_vocab_top_k, vocab_top_k
from ddtree_jax.tuning import GPU_TREE, TreeTuning, VocabTopK, tuning_for


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


def base_tuning(name: str) -> TreeTuning:
    """The TreeTuning that --tuning names; a GPU tuning runs its kernels interpreted off a GPU."""
    tuning = {"gpu": GPU_TREE, "cpu": TreeTuning(), "device": tuning_for().tree}[name]
    if tuning.kernels == "pallas" and jax.default_backend() != "gpu":
        tuning = dataclasses.replace(tuning, kernels="pallas_interpret")
    return tuning


def parse_value(cls: type, field: str, text: str):
    """`text` as a value of `cls`'s field (ValueError naming what to give)."""
    hints = typing.get_type_hints(cls)
    if field not in hints:
        names = ", ".join(f.name for f in dataclasses.fields(cls))
        raise ValueError(f"{cls.__name__} has no field {field!r}; its fields: {names}")
    typ = hints[field]
    if field == "vocab_topk":
        if text != "none":
            raise ValueError("give none (one lax.top_k), or set vocab_topk.FIELD")
        return None
    if typ is bool:
        if text not in ("0", "1"):
            raise ValueError(f"{field}: give 0 or 1")
        return text == "1"
    if typ is int:
        if not re.fullmatch(r"\d+", text):
            raise ValueError(f"{field}: give a whole number")
        return int(text)
    if field == "pair_kernel_tile":
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
        if not m:
            raise ValueError(f"{field}: give TIxAxWARPS, e.g. 16x32x4")
        return tuple(int(x) for x in m.groups())
    return text


def with_setting(tuning: TreeTuning, field: str, text: str) -> TreeTuning:
    """`tuning` with FIELD (or vocab_topk.FIELD) set from `text`."""
    head, _, sub = field.partition(".")
    if head == "vocab_topk" and sub:
        topk = tuning.vocab_topk or VocabTopK()
        topk = dataclasses.replace(topk, **{sub: parse_value(VocabTopK, sub, text)})
        return dataclasses.replace(tuning, vocab_topk=topk)
    return dataclasses.replace(tuning, **{field: parse_value(TreeTuning, field, text)})


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
                         "256x16,1024x8; KEEP 0 = keep K; XLA's stages, or with a trailing t the threshold "
                         "kernel's first stage, then optionally rBITS and wWARPS for its radix bits and warps, "
                         "128x64tr4w2): rows gain topk_<variant>_ms")
    ap.add_argument("--tuning", choices=("device", "gpu", "cpu"), default="device",
                    help="the build's TreeTuning: this device's, GPU_TREE or the CPU's (default: device)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a field of the tuning, e.g. --set ancestor_chain_from=0 (repeatable)")
    ap.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2",
                    help="time one build per value, e.g. --vary rank_by_count_max=0,8192 (repeatable: the "
                         "product); rows gain build_ms_FIELDVALUE...")
    ap.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                    help="also trace one loop of each build variant: its kernels by device time and the "
                         "span a build (default: on a GPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.trace is None:
        args.trace = jax.default_backend() == "gpu"
    tuning = base_tuning(args.tuning)
    varied = []
    try:
        for item in args.set:
            field, eq, value = item.partition("=")
            if not eq:
                raise ValueError(f"--set {item}: give FIELD=VALUE")
            tuning = with_setting(tuning, field, value)
        for item in args.vary:
            field, eq, values = item.partition("=")
            if not eq or not values:
                raise ValueError(f"--vary {item}: give FIELD=V1,V2,...")
            for v in values.split(","):
                with_setting(tuning, field, v)       # checked before any timing
            varied.append((field, values.split(",")))
    except (ValueError, TypeError) as e:
        ap.error(str(e))
    variants = []
    for v in filter(None, args.variants.lower().split(",")):
        m = re.fullmatch(r"(\d+)x(\d+)(?:t(?:r(\d+))?(?:w(\d+))?)?", v)
        if not m:
            ap.error(f"--variants {v}: not CHUNKSxKEEP[t[rBITS][wWARPS]] (e.g. 128x64tr4w2)")
        chunks, keep, bits, warps = m.groups()
        options = {**({"radix_bits": int(bits)} if bits else {}), **({"num_warps": int(warps)} if warps else {})}
        impl = "xla" if "t" not in v else ("threshold" if jax.default_backend() == "gpu" else "threshold_interpret")
        variants.append((v, int(chunks), int(keep), impl, options))
    logp = jax.nn.log_softmax(3.0 * jax.random.normal(jax.random.PRNGKey(0), (1, args.depth, args.vocab)), -1)
    policy = make_policy(args.policy)
    rows = []
    for b in [int(x) for x in args.budgets.split(",") if x]:
        k = min(b, args.vocab)
        r = dict(budget=b, k=k)
        r["topk_ms"] = timed(lambda x: jax.lax.top_k(x, k), logp, args.inner, args.repeats)
        r["topk_tuned_ms"] = timed(lambda x: tuned_vocab_top_k(x, k, tuning), logp, args.inner, args.repeats)
        r["topk2_ms"] = timed(lambda x: vocab_top_k(x, k, chunks=128), logp, args.inner, args.repeats)
        r["topk2_keep_ms"] = timed(lambda x: vocab_top_k(x, k, chunks=128, keep=args.keep), logp,
                                   args.inner, args.repeats)
        if args.keep < k:  # the worst case: the K best tokens in one chunk force the exact fallback
            clustered = logp.at[:, :, :k].add(100.0)
            r["topk2_keep_fallback_ms"] = timed(lambda x: vocab_top_k(x, k, chunks=128, keep=args.keep),
                                                clustered, args.inner, args.repeats)
        for name, chunks, keep, impl, options in variants:
            r[f"topk_{name}_ms"] = timed(
                lambda x, c=chunks, kp=keep, im=impl, o=options: vocab_top_k(
                    x, k, chunks=c, keep=kp or None, stage1=im, **o),
                logp, args.inner, args.repeats)
        for values in itertools.product(*(vs for _, vs in varied)):
            t, name = tuning, "build_ms"
            for (field, _), value in zip(varied, values):
                t = with_setting(t, field, value)
                name += f"_{field}{value}"
            built = policy.with_tuning(t)
            r[name] = timed(lambda x: built.build(x, b), logp, args.inner, args.repeats)
            if args.trace:
                tr = r[name.replace("build_ms", "build_trace")] = traced(lambda x: built.build(x, b), logp, args.inner)
                if tr:
                    top = list(tr["kernels_us"].items())[:12]
                    print(f"[bench_tree] {args.policy} B={b:5d} {name[9:] or 'default'} by device time: span "
                          f"{tr['span_us']:.1f} us a build, kernels {tr['busy_us']:.1f} us in {tr['launches']:.0f} "
                          "launches; " + ", ".join(f"{k} {us:.1f}" for k, us in top), flush=True)
        rows.append(r)
        builds = ", ".join(f"{k[9:] or 'as tuned'} {v:.3f}" for k, v in r.items() if k.startswith("build_ms"))
        builds += "".join(f"; {k[:-3]} {v:.3f}" for k, v in r.items()
                          if k.startswith("topk_") and k not in ("topk_ms", "topk_tuned_ms"))
        print(f"[bench_tree] {args.policy} B={b:5d}: top_k {r['topk_ms']:.3f} ms, as tuned {r['topk_tuned_ms']:.3f}, "
              f"two-stage top_k {r['topk2_ms']:.3f} ms (keeping {args.keep} a chunk {r['topk2_keep_ms']:.3f}"
              + (f", its fallback {r['topk2_keep_fallback_ms']:.3f}" if "topk2_keep_fallback_ms" in r else "")
              + f"), whole build {builds} ms", flush=True)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_tree.json").write_text(json.dumps(
            dict(device=jax.devices()[0].device_kind, jax=jax.__version__, vocab=args.vocab, depth=args.depth,
                 policy=args.policy, tuning=repr(tuning), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
