"""On-device equality of the tree build's fast paths with plain XLA: the same DraftTree.

    python3 -m bench.check_tree                       # GPU: GPU_TREE vs a sort + XLA
    python3 -m bench.check_tree --interpret --vocab 3000 --budgets 16    # CPU smoke run

The CPU tests compare the Pallas paths in interpret mode; this builds the DDTree tree on the
device with the GPU's tree tuning (`ddtree_jax.tuning.GPU_TREE`: the two-stage vocabulary top-k,
the pairwise ranks, pair_select and runs_select from their sizes, chained ancestors) and, unless
--no-forced, with the selection kernels forced on at every size (pair_kernel_from and
runs_kernel_from 1), and compares every array with a build by the default `TreeTuning()` (XLA's
ops: sorts, gathers, squared ancestors) whose vocabulary top-k is one total-order sort
(`top_k_by_sort`), on log-probs with distinct values, many ties, and signed zeros. Exits non-zero
on any difference.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.kernels.chunk_topk import order_key
from ddtree_jax.trees import ddtree, make_policy
from ddtree_jax.tuning import GPU_TREE, TreeTuning


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
    ap.add_argument("--forced", action=argparse.BooleanOptionalAction, default=True,
                    help="also build with pair_select and runs_select at every size")
    ap.add_argument("--interpret", action="store_true",
                    help="off the GPU: the GPU's tuning with the Pallas kernels in interpret mode")
    args = ap.parse_args(argv)
    fast = dataclasses.replace(GPU_TREE, kernels="pallas_interpret") if args.interpret else GPU_TREE
    variants = [("GPU tuning", fast)]
    if args.forced:
        variants.append(("GPU tuning, kernels at every size",
                         dataclasses.replace(fast, pair_kernel_from=1, runs_kernel_from=1)))
    bad = 0
    for b in [int(x) for x in args.budgets.split(",") if x]:
        for kind in ("float", "ties", "zeros"):
            logp = logp_of(kind, (2, args.depth, args.vocab), seed=b)
            reference = make_policy("ddtree").with_tuning(TreeTuning())
            with mock.patch.object(ddtree, "vocab_top_k", top_k_by_sort):
                want = jax.jit(lambda x: reference.build(x, b))(logp)
            for name, tuning in variants:
                policy = make_policy("ddtree").with_tuning(tuning)
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
