"""ddtree_jax/kernels/pair_select.py in interpret mode: a depth's n best sums over the staircase of
(beam row, rank) pairs, equal to the XLA reference (ties, -inf, signed zeros, few rows, long short
rows, n = P); its errors; DDTree's tree with every depth in it (and / or the final selection in
runs_select) equals the heap reference and, array for array, the tree of XLA's selections; the
GPU's whole tree tuning in interpret mode builds the heap's tree; and its Triton module lowers for
CUDA and verifies."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels.pair_select import pair_select
from ddtree_jax.trees import ddtree, make_policy
from ddtree_jax.tuning import GPU_TREE, TreeTuning
from test_kernels import _verified_triton_modules
from test_trees import check_ddtree_against_heap, make_logp


def _sorted_rows(rng, shape, ties: bool):
    x = rng.normal(size=shape) * 2
    if ties:
        x = np.round(x * 2) / 2
    x = np.where(rng.random(shape) < 0.1, -np.inf, x)
    x = -np.sort(-x, axis=-1)
    if ties:  # signed zeros, in either order: equal under `>`
        x = np.where(x == 0, np.where(rng.random(shape) < 0.5, -0.0, 0.0), x)
    return jnp.asarray(x, jnp.float32)


def _staircase(prev: int, k: int, room: int) -> tuple[int, ...]:
    """_beam_bounds' row lengths for the exact tree: min(k, room // (i + 1) - 1), positive."""
    return tuple(x for x in (min(k, room // (i + 1) - 1) for i in range(prev)) if x > 0)


@pytest.mark.parametrize("bt,prev,k,room,n,ti,a,ties", [
    (2, 40, 50, 60, 30, 16, 8, True),       # rows past A, searched by column
    (1, 100, 100, 100, 97, 32, 32, False),
    (2, 300, 300, 256, 250, 32, 32, True),  # B = 256's depth-2 staircase
    (1, 20, 8, 40, 10, 8, 4, True),         # rows capped at K
    (3, 6, 9, 30, 12, 16, 32, True),        # fewer rows than A: no column part
    (1, 12, 12, 24, None, 16, 4, True),     # n = P
])
def test_pair_select_equals_the_reference(bt, prev, k, room, n, ti, a, ties):
    rng = np.random.default_rng(prev * k + room)
    beam = _sorted_rows(rng, (bt, prev), ties)
    lp = _sorted_rows(rng, (bt, k), ties)
    tok = jnp.asarray(np.stack([rng.permutation(10 * k)[:k] for _ in range(bt)]), jnp.int32)
    row_len = _staircase(prev, k, room)
    n = n or sum(row_len)
    got = jax.jit(lambda b, l, t: pair_select(b, l, t, n, row_len, impl="pallas_interpret", ti=ti, a=a))(beam, lp, tok)
    want = pair_select(beam, lp, tok, n, row_len, impl="xla")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert (np.signbit(np.asarray(got[0])) == np.signbit(np.asarray(want[0]))).all()


def test_pair_select_reads_rows_of_the_tree_arrays_in_place():
    """depth / beam_depth: lp, tok and the beam as rows of [Bt, D, K] arrays, as the tree build
    passes them (depth 1's beam is row 0 of the log-probs), equal to the 2-D call."""
    rng = np.random.default_rng(7)
    vals = jnp.stack([_sorted_rows(rng, (2, 64), True) for _ in range(3)], axis=1)      # [2, 3, 64]
    toks = jnp.asarray(rng.integers(0, 1000, (2, 3, 64)), jnp.int32)
    row_len = _staircase(40, 64, 64)
    got = pair_select(vals, vals, toks, 50, row_len, depth=2, beam_depth=0, impl="pallas_interpret", a=8)
    want = pair_select(vals[:, 0, :40], vals[:, 2], toks[:, 2], 50, row_len, impl="pallas_interpret", a=8)
    ref = pair_select(vals, vals, toks, 50, row_len, depth=2, beam_depth=0, impl="xla")
    for g, w, r in zip(got, want, ref):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))


def test_pair_select_errors():
    beam, lp, tok = jnp.zeros((1, 4)), jnp.zeros((1, 3)), jnp.zeros((1, 3), jnp.int32)
    with pytest.raises(ValueError, match="non-increasing"):
        pair_select(beam, lp, tok, 2, (1, 2), impl="pallas_interpret")
    with pytest.raises(ValueError, match="non-increasing"):
        pair_select(beam, lp, tok, 2, (4,), impl="pallas_interpret")      # longer than K
    with pytest.raises(ValueError, match="0 < n <="):
        pair_select(beam, lp, tok, 5, (2, 2), impl="pallas_interpret")
    with pytest.raises(ValueError, match="must both be"):
        pair_select(beam, lp, tok[:, :2], 2, (2,), impl="pallas_interpret")
    with pytest.raises(ValueError, match="must both be"):
        pair_select(beam, lp, tok, 2, (2,), depth=1, impl="pallas_interpret")     # 2-D with a depth
    with pytest.raises(ValueError, match="powers of two"):
        pair_select(beam, lp, tok, 2, (2,), impl="pallas_interpret", a=3)
    with pytest.raises(ValueError, match="choose one of"):
        pair_select(beam, lp, tok, 2, (2,), impl="triton")


def _spy_kernels(monkeypatch, names=("pair", "runs")) -> list:
    """Record (name, keyword arguments) of every call of ddtree's pair_select / runs_select."""
    calls = []
    for name in names:
        real = getattr(ddtree, f"{name}_select")
        monkeypatch.setattr(ddtree, f"{name}_select",
                            lambda *a, real=real, name=name, **k: calls.append((name, k)) or real(*a, **k))
    return calls


@pytest.mark.parametrize("case,kind,kernels", [((2, 6, 300, 64), "ties", ("pair",)),
                                               ((1, 10, 400, 100), "dyadic", ("pair", "runs")),
                                               ((2, 5, 50, 70), "float", ("runs",)),
                                               ((2, 7, 500, 90), "float", ("pair", "runs"))])
def test_ddtree_with_the_pair_and_runs_kernels_equals_the_heap_and_xla(case, kind, kernels, monkeypatch):
    """Every depth's selection in pair_select (pair_kernel_from = 1) and / or the final one in
    runs_select (runs_kernel_from = 1), interpreted: the same arrays as XLA's selections build
    (and, once, the heap's tree directly)."""
    batch, depth, vocab, budget = case
    x = jnp.asarray(make_logp(kind, (batch, depth, vocab), sum(case)))
    want = jax.jit(lambda x: make_policy("ddtree").build(x, budget))(x)
    tuning = TreeTuning(kernels="pallas_interpret", pair_kernel_from=1 if "pair" in kernels else 0,
                        runs_kernel_from=1 if "runs" in kernels else 0)
    calls = _spy_kernels(monkeypatch)
    got = jax.jit(lambda x: make_policy("ddtree").with_tuning(tuning).build(x, budget))(x)
    assert {c[0] for c in calls} == set(kernels) and {c[1]["impl"] for c in calls} == {"pallas_interpret"}
    for f in dataclasses.fields(want):
        np.testing.assert_array_equal(np.asarray(getattr(got, f.name)), np.asarray(getattr(want, f.name)), f.name)
    if kind == "ties":  # XLA's selections build the heap's tree (test_trees); one direct check here
        check_ddtree_against_heap(case, kind, seed=sum(case), tuning=tuning)


def test_pair_select_triton_lowering_verifies(monkeypatch):
    """B = 1024's depth-2 selection (6238 candidates in 511 rows, 1023 kept) lowers for CUDA, on
    a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    prev, pairs, n_sel = ddtree._depth_plan(1024, 1024, 1024, 1024, 3)[0]
    row_len = ddtree._row_lengths(pairs)
    assert sum(row_len) == len(pairs) == 6238
    fn = lambda b, l, t: pair_select(b, l, t, n_sel, row_len)
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((1, prev), jnp.float32), jax.ShapeDtypeStruct((1, 1024), jnp.float32),
                          jax.ShapeDtypeStruct((1, 1024), jnp.int32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


def test_gpu_tree_tuning_in_interpret_mode_equals_the_heap(monkeypatch):
    """GPU_TREE, its kernels interpreted, at a size where every path it sets runs: every depth of
    >= 100 candidates in pair_select with its tiles, the final selection of >= 1000 entries in
    runs_select, chained ancestors (301 slots), the pairwise ranks behind barriers, and a two-stage
    vocabulary top-k (threshold first stage, select second stage; chunks cut to this vocabulary)."""
    topk = dataclasses.replace(GPU_TREE.vocab_topk, chunks=16, keep=32, keep_from_k=256)
    tuning = dataclasses.replace(GPU_TREE, kernels="pallas_interpret", vocab_topk=topk)
    plan = ddtree._depth_plan(300, 300, 300, 300, 5)
    assert all(len(pairs) >= GPU_TREE.pair_kernel_from for _, pairs, _ in plan)
    assert 300 + sum(n for *_, n in plan) >= GPU_TREE.runs_kernel_from
    assert ddtree._stage2(300, tuning) == "select_interpret"
    calls = _spy_kernels(monkeypatch)
    check_ddtree_against_heap((1, 5, 600, 300), "ties", seed=6, tuning=tuning)
    assert [c[0] for c in calls] == ["pair"] * len(plan) + ["runs"]
    ti, a, warps = GPU_TREE.pair_kernel_tile
    assert all((k["ti"], k["a"], k["num_warps"]) == (ti, a, warps) for name, k in calls if name == "pair")
