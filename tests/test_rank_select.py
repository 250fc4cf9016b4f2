"""ddtree_jax/kernels/rank_select.py in interpret mode: the n best under (score desc, position asc)
with payloads, equal to the XLA reference and to ddtree.select_best (ties, -inf, signed zeros,
rows not a multiple of the tile, n = P); its errors; DDTree's tree with every selection in it
equals the heap reference; and its Triton module lowers for CUDA and verifies."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.trees import ddtree
from ddtree_jax.kernels.rank_select import rank_select
from test_kernels import _verified_triton_modules
from test_trees import check_ddtree_against_heap


def _scores(rng, bt, p):
    s = np.round(rng.normal(size=(bt, p)) * 2) / 2          # many exact ties
    s = np.where(rng.random((bt, p)) < 0.2, -np.inf, s)
    s[0, :3] = [-0.0, 0.0, -0.0]                             # signed zeros compare equal
    return jnp.asarray(s, jnp.float32)


@pytest.mark.parametrize("bt,p,n,ti,tj", [(2, 300, 40, 32, 128), (1, 77, 77, 32, 128), (3, 1000, 129, 64, 256),
                                          (1, 5, 1, 32, 128), (2, 130, 64, 16, 32),
                                          (2, 200, 50, 64, 32)])
def test_rank_select_equals_the_reference_and_select_best(bt, p, n, ti, tj):
    rng = np.random.default_rng(p + n)
    s = _scores(rng, bt, p)
    pay = jnp.asarray(rng.integers(0, 1000, (bt, p)), jnp.int32)
    got = jax.jit(lambda s, pay: rank_select(s, n, pay, impl="pallas_interpret", ti=ti, tj=tj))(s, pay)
    want = rank_select(s, n, pay, impl="xla")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert (np.signbit(np.asarray(got[0])) == np.signbit(np.asarray(want[0]))).all()
    positions = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), s.shape)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(ddtree.select_best(s, positions, n)))


def test_rank_select_errors():
    s = jnp.zeros((1, 8), jnp.float32)
    with pytest.raises(ValueError, match="0 < n <= P"):
        rank_select(s, 9, impl="pallas_interpret")
    with pytest.raises(ValueError, match="choose one of"):
        rank_select(s, 2, impl="triton")


@pytest.mark.parametrize("case,kind", [((2, 6, 300, 64), "ties"), ((1, 15, 400, 100), "dyadic"),
                                       ((2, 5, 50, 70), "float")])
def test_ddtree_with_the_rank_kernel_equals_the_heap(case, kind, monkeypatch):
    """Every depth's selection and the final one in the kernel (RANK_KERNEL_FROM = 1)."""
    monkeypatch.setitem(ddtree.RANK_KERNEL_FROM, jax.default_backend(), 1)
    calls = []
    real = ddtree.rank_select
    monkeypatch.setattr(ddtree, "rank_select", lambda *a, **k: calls.append(k["impl"]) or real(*a, **k))
    check_ddtree_against_heap(case, kind, seed=sum(case), fresh_trace=True)
    assert calls and set(calls) == {"pallas" if jax.default_backend() == "gpu" else "pallas_interpret"}


def test_rank_select_triton_lowering_verifies(monkeypatch):
    """B = 1024's depth-2 selection (6238 candidates, 1023 kept) lowers for CUDA, on a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    fn = lambda s, t: rank_select(s, 1023, t)
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((1, 6238), jnp.float32),
                          jax.ShapeDtypeStruct((1, 6238), jnp.int32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


def test_ddtree_with_the_gpu_rank_kernel_settings_equals_the_heap(monkeypatch):
    """The GPU's shipped settings (RANK_KERNEL_FROM and RANK_KERNEL_TILE), given to this backend:
    depths of ~2000 candidates and the final selection in the kernel with its tiles."""
    backend = jax.default_backend()
    monkeypatch.setitem(ddtree.RANK_KERNEL_FROM, backend, ddtree.RANK_KERNEL_FROM["gpu"])
    monkeypatch.setitem(ddtree.RANK_KERNEL_TILE, backend, ddtree.RANK_KERNEL_TILE["gpu"])
    assert len(ddtree._depth_plan(400, 400, 400, 400, 4)[0][1]) >= ddtree.RANK_KERNEL_FROM["gpu"]
    calls = []
    real = ddtree.rank_select
    monkeypatch.setattr(ddtree, "rank_select", lambda *a, **k: calls.append(k) or real(*a, **k))
    check_ddtree_against_heap((1, 4, 600, 400), "ties", seed=5, fresh_trace=True)
    assert len(calls) == 4 and all(k["tj"] == ddtree.RANK_KERNEL_TILE["gpu"]["tj"] for k in calls)
