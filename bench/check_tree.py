"""On-device equality of the tree build's fast paths with plain XLA: the same DraftTree.

    python3 -m bench.check_tree                       # GPU: the backend's settings vs a sort + XLA
    python3 -m bench.check_tree --interpret --vocab 3000 --budgets 16    # CPU smoke run

The CPU tests compare the Pallas paths in interpret mode; this builds the DDTree tree on the
device with the backend's settings (ddtree.VOCAB_TOPK: the chunked first stage and, where
`stage2_max_k` covers K, the threshold second stage, else with `stage2_select` the select_top
one; ddtree.SELECT_TOP_FROM's prefilter) and with the one-kernel depth loop forced on
(ddtree.BEAM_KERNEL_MAX; --no-beam-kernel leaves it out) and with every selection in the
rank_select kernel (ddtree.RANK_KERNEL_FROM; --no-rank-kernel leaves it out) and with every depth in the
pair_select kernel (ddtree.PAIR_KERNEL_FROM; --no-pair-kernel leaves it out), and compares every array with a build
that uses XLA's depth loop without the prefilter, the final selection without the merge
(ddtree.FINAL_MERGE_FROM) or the runs_select kernel (ddtree.RUNS_KERNEL_FROM), and a vocabulary top-k by one total-order sort
(`top_k_by_sort`), on log-probs
with distinct values, many ties, and signed zeros. Exits non-zero on any difference.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.trees import ddtree, make_policy
from ddtree_jax.kernels.chunk_topk import order_key


def logp_of(kind: str, shape, seed: int):
    x = jax.nn.log_softmax(3.0 * jax.random.normal(jax.random.PRNGKey(seed), shape), -1)
    if kind == "ties":
        x = jnp.round(x * 2) / 2
    elif kind == "zeros":   # -0.0 and +0.0 (and nothing else) on half the vocabulary
        sign = jax.random.bernoulli(jax.random.PRNGKey(seed + 1), 0.5, shape)
        x = jnp.where(jnp.arange(shape[-1]) % 2 == 0, jnp.where(sign, 0.0, -0.0), x - 50.0)
    return x


def top_k_by_sort(logp, k, *_, **__):
    """`lax.top_k`'s contract by one sort in the float total order (-0.0 below +0.0; equal values
    by lower index first). The reference: on GPUs lax.top_k with K <= 16 runs XLA's TopK kernel,
    which ranks -0.0 and +0.0 as equal, while the CPU and the fast paths use the total order."""
    key = order_key(logp)
    idx = jnp.broadcast_to(jnp.arange(logp.shape[-1], dtype=jnp.int32), logp.shape)
    _, _, vals, order = jax.lax.sort((-1 - key, idx, logp, idx), dimension=-1, num_keys=2)
    return vals[..., :k], order[..., :k]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.check_tree", description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--depth", type=int, default=15)
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--beam-kernel", action=argparse.BooleanOptionalAction, default=True,
                    help="also build with the one-kernel depth loop forced on (slow from B = 256)")
    ap.add_argument("--rank-kernel", action=argparse.BooleanOptionalAction, default=True,
                    help="also build with every selection in the rank_select kernel (ddtree.RANK_KERNEL_FROM)")
    ap.add_argument("--pair-kernel", action=argparse.BooleanOptionalAction, default=True,
                    help="also build with every depth's selection in the pair_select kernel (ddtree.PAIR_KERNEL_FROM)")
    ap.add_argument("--interpret", action="store_true",
                    help="off the GPU: give this backend the GPU's settings with the Pallas kernels in interpret mode")
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    policy = make_policy("ddtree")
    fast = dict(ddtree.VOCAB_TOPK.get("gpu", {}))
    top_from = {backend: ddtree.SELECT_TOP_FROM.get("gpu", 0)} if args.interpret else {}
    if args.interpret:
        fast.update(stage1=fast.get("stage1", "xla") + "_interpret" * (fast.get("stage1", "xla") != "xla"))
    bad = 0
    for b in [int(x) for x in args.budgets.split(",") if x]:
        for kind in ("float", "ties", "zeros"):
            logp = logp_of(kind, (2, args.depth, args.vocab), seed=b)
            with mock.patch.object(ddtree, "vocab_top_k", top_k_by_sort), \
                    mock.patch.dict(ddtree.BEAM_KERNEL_MAX, {backend: 0}), \
                    mock.patch.dict(ddtree.SELECT_TOP_FROM, {backend: 0}), \
                    mock.patch.dict(ddtree.FINAL_MERGE_FROM, {backend: 0}), \
                    mock.patch.dict(ddtree.RANK_KERNEL_FROM, {backend: 0}), \
                    mock.patch.dict(ddtree.PAIR_KERNEL_FROM, {backend: 0}), \
                    mock.patch.dict(ddtree.RUNS_KERNEL_FROM, {backend: 0}):
                want = jax.jit(lambda x: policy.build(x, b))(logp)
            variants = ([("settings", None, None, None)]
                        + [("settings + beam kernel", 1 << 20, None, None)] * args.beam_kernel
                        + [("settings + rank kernel", 0, 1, None)] * args.rank_kernel
                        + [("settings + pair kernel", 0, None, 1)] * args.pair_kernel)
            for name, beam, rank, pair in variants:
                with mock.patch.dict(ddtree.VOCAB_TOPK, {backend: fast} if (args.interpret or backend == "gpu") else {}), \
                        mock.patch.dict(ddtree.SELECT_TOP_FROM, top_from), \
                        mock.patch.dict(ddtree.BEAM_KERNEL_MAX, {} if beam is None else {backend: beam}), \
                        mock.patch.dict(ddtree.RANK_KERNEL_FROM, {} if rank is None else {backend: rank}), \
                        mock.patch.dict(ddtree.PAIR_KERNEL_FROM, {} if pair is None else {backend: pair}):
                    got = jax.jit(lambda x: policy.build(x, b))(logp)
                fields = [(f.name, getattr(got, f.name), getattr(want, f.name)) for f in dataclasses.fields(got)]
                diffs = {field: int(np.sum(np.asarray(x) != np.asarray(y)))
                         for field, x, y in fields if not np.array_equal(np.asarray(x), np.asarray(y))}
                bad += bool(diffs)
                detail = ", ".join(f"{f} differs at {n}" for f, n in diffs.items())
                print(f"[check_tree] B={b} {kind:6s} {name}: {'DIFFERENT (' + detail + ')' if diffs else 'equal'}",
                      flush=True)
    print(f"[check_tree] {'all equal' if not bad else f'{bad} differ'} on {jax.devices()[0].device_kind}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
