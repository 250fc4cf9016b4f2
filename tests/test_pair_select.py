"""ddtree_jax/kernels/pair_select.py in interpret mode: a depth's n best sums over the staircase of
(beam row, rank) pairs, equal to the XLA reference (ties, -inf, signed zeros, few rows, long short
rows, n = P); its errors; DDTree's tree with every depth in it (and / or the final selection in
runs_select) equals the heap reference and, array for array, the tree of XLA's selections; and
its Triton module lowers for CUDA and verifies."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.trees import ddtree, make_policy
from ddtree_jax.kernels.pair_select import pair_select
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


@pytest.mark.parametrize("case,kind,kernels", [((2, 6, 300, 64), "ties", ("pair",)),
                                               ((1, 10, 400, 100), "dyadic", ("pair", "runs")),
                                               ((2, 5, 50, 70), "float", ("runs",)),
                                               ((2, 7, 500, 90), "float", ("pair", "runs"))])
def test_ddtree_with_the_pair_and_runs_kernels_equals_the_heap_and_xla(case, kind, kernels, monkeypatch):
    """Every depth's selection in pair_select (PAIR_KERNEL_FROM = 1) and / or the final one in
    runs_select (RUNS_KERNEL_FROM = 1): the same arrays as XLA's selections build (and, once,
    the heap's tree directly)."""
    batch, depth, vocab, budget = case
    backend = jax.default_backend()
    x = jnp.asarray(make_logp(kind, (batch, depth, vocab), sum(case)))
    build = lambda: jax.jit(lambda x: make_policy("ddtree").build(x, budget))(x)
    monkeypatch.setitem(ddtree.RUNS_KERNEL_FROM, backend, 0)
    monkeypatch.setitem(ddtree.RANK_KERNEL_FROM, backend, 0)
    want = build()
    calls = []
    for name in kernels:
        monkeypatch.setitem(getattr(ddtree, f"{name.upper()}_KERNEL_FROM"), backend, 1)
        real = getattr(ddtree, f"{name}_select")
        monkeypatch.setattr(ddtree, f"{name}_select",
                            lambda *a, real=real, name=name, **k: calls.append((name, k["impl"])) or real(*a, **k))
    got = build()
    impl = "pallas" if backend == "gpu" else "pallas_interpret"
    assert {c[0] for c in calls} == set(kernels) and {c[1] for c in calls} == {impl}
    for f in dataclasses.fields(want):
        np.testing.assert_array_equal(np.asarray(getattr(got, f.name)), np.asarray(getattr(want, f.name)), f.name)
    if kind == "ties":  # XLA's selections build the heap's tree (test_trees); one direct check here
        check_ddtree_against_heap(case, kind, seed=sum(case), fresh_trace=True)


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


def test_ddtree_with_the_gpu_pair_and_runs_settings_equals_the_heap(monkeypatch):
    """The GPU's shipped settings (PAIR_KERNEL_FROM / PAIR_KERNEL_TILE / RUNS_KERNEL_FROM), given to
    this backend: every depth of >= 100 candidates in pair_select with its tiles, the final
    selection of >= 1000 entries in runs_select."""
    backend = jax.default_backend()
    for table in (ddtree.PAIR_KERNEL_FROM, ddtree.PAIR_KERNEL_TILE, ddtree.RUNS_KERNEL_FROM):
        monkeypatch.setitem(table, backend, table["gpu"])
    plan = ddtree._depth_plan(300, 300, 300, 300, 5)
    assert all(len(pairs) >= ddtree.PAIR_KERNEL_FROM["gpu"] for _, pairs, _ in plan)
    assert 300 + sum(n for *_, n in plan) >= ddtree.RUNS_KERNEL_FROM["gpu"]
    calls = []
    for name in ("pair", "runs"):
        real = getattr(ddtree, f"{name}_select")
        monkeypatch.setattr(ddtree, f"{name}_select",
                            lambda *a, real=real, name=name, **k: calls.append((name, k)) or real(*a, **k))
    check_ddtree_against_heap((1, 5, 600, 300), "ties", seed=6, fresh_trace=True)
    assert [c[0] for c in calls] == ["pair"] * len(plan) + ["runs"]
    assert all(k["ti"] == ddtree.PAIR_KERNEL_TILE["gpu"]["ti"] for name, k in calls if name == "pair")
