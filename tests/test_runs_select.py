"""ddtree_jax/kernels/runs_select.py in interpret mode: the n best of rows made of sorted runs equal
the XLA reference (`select_reference`) bit for bit and the tree build's XLA selection
(`ddtree.select_best`) position for position (ties within and across runs, -inf, signed zeros,
one run, runs of width 1, rows not a multiple of the tile, n = T and n = 1); its errors; and its
Triton module for DDTree's final selection at B = 1024 lowers for CUDA and verifies."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels.runs_select import runs_select
from ddtree_jax.trees import ddtree
from test_kernels import _verified_triton_modules


def _runs(rng, bt, widths):
    """Rows of runs, each sorted best first: many exact ties (halves), some -inf, zeros of both
    signs in any order among the equal zeros."""
    rows = []
    for _ in range(bt):
        row = []
        for w in widths:
            x = np.round(rng.normal(size=w) * 2) / 2
            x = np.where(rng.random(w) < 0.15, -np.inf, x)
            x = -np.sort(-x)                                     # descending
            zeros = x == 0
            x[zeros] = np.where(rng.random(zeros.sum()) < 0.5, -0.0, 0.0)
            row.append(x)
        rows.append(np.concatenate(row))
    return jnp.asarray(np.stack(rows), jnp.float32)


@pytest.mark.parametrize("bt,widths,n,ti", [
    (2, (40, 33, 27, 1, 60), 50, 32),                 # widths not multiples of ti
    (1, (77,), 77, 32),                               # one run, n = T
    (2, (1,) * 9, 9, 16),                             # runs of width 1, n = T
    (3, (130, 129, 100, 64, 5), 1, 64),               # n = 1
    (1, (300, 299, 298, 1, 2), 256, 128),
    (2, (8, 16, 3), 20, 8),
])
def test_runs_select_equals_the_reference(bt, widths, n, ti):
    rng = np.random.default_rng(sum(widths) + n)
    s = _runs(rng, bt, widths)
    t = s.shape[1]
    pays = [jnp.asarray(rng.integers(-1000, 1000, (bt, t)), jnp.int32) for _ in range(3)]
    got = jax.jit(lambda s, *p: runs_select(s, n, widths, *p, impl="pallas_interpret", ti=ti))(s, *pays)
    want = runs_select(s, n, widths, *pays, impl="xla")
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        assert g.shape == w.shape == (bt, n) and g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert (np.signbit(np.asarray(got[0])) == np.signbit(np.asarray(want[0]))).all()
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), s.shape)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(ddtree.select_best(s, positions, n)))


def test_runs_select_errors():
    s = jnp.zeros((1, 8), jnp.float32)
    with pytest.raises(ValueError, match="choose one of"):
        runs_select(s, 2, (8,), impl="triton")
    with pytest.raises(ValueError, match="sum to 7"):
        runs_select(s, 2, (3, 4), impl="pallas_interpret")
    with pytest.raises(ValueError, match="width >= 1"):
        runs_select(s, 2, (8, 0), impl="pallas_interpret")
    with pytest.raises(ValueError, match="width >= 1"):
        runs_select(s, 2, (), impl="xla")
    with pytest.raises(ValueError, match="0 < n <= T"):
        runs_select(s, 9, (4, 4), impl="pallas_interpret")
    with pytest.raises(ValueError, match="0 < n <= T"):
        runs_select(s, 0, (4, 4), impl="xla")
    with pytest.raises(ValueError, match="power of two"):
        runs_select(s, 2, (4, 4), impl="pallas_interpret", ti=48)


def test_runs_select_triton_lowering_verifies(monkeypatch):
    """B = 1024's final selection (14 runs, ~14.3k entries, 1024 kept, two payloads) lowers for
    CUDA, on a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    widths = (1024,) + tuple(range(1023, 1010, -1))
    t = sum(widths)
    fn = lambda s, a, b: runs_select(s, 1024, widths, a, b)
    sds = jax.ShapeDtypeStruct
    try:
        jax.jit(fn).trace(sds((1, t), jnp.float32), sds((1, t), jnp.int32),
                          sds((1, t), jnp.int32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()
