"""ddtree_jax.kernels.select_top: the kernel (interpret mode) keeps exactly the reference sort's m
best positions (score desc in the float total order, then position), and lowers for CUDA."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels.select_top import select_top, select_top_reference
from test_kernels import _verified_triton_modules

KINDS = ("float", "ties", "zeros", "neginf")


def make(kind, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    if kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "zeros":       # -0.0, +0.0 and a few negatives
        x = np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(np.float32)
        x[..., ::7] = -1.0
    elif kind == "neginf":
        x[..., ::3] = -np.inf
    return jnp.asarray(x)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,m", [((3, 100), 7), ((2, 1000), 1000), ((1, 6238), 1023), ((2, 2, 37), 1)])
def test_select_top_equals_the_sort(kind, shape, m):
    """The positions of the m best (score desc, -0.0 below +0.0; then the lower position),
    ascending, exactly as the reference's sort."""
    x = make(kind, shape, seed=m + len(kind))
    got = select_top(x, m, impl="pallas_interpret")
    want = select_top_reference(x, m)
    assert got.shape == (*shape[:-1], m) and got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_select_top_reference_by_hand():
    x = jnp.asarray([[1.0, 3.0, 3.0, -0.0, 0.0, 2.0]])
    assert select_top_reference(x, 3).tolist() == [[1, 2, 5]]
    assert select_top_reference(x, 2).tolist() == [[1, 2]]
    # total order: +0.0 beats -0.0
    assert select_top_reference(x, 5).tolist() == [[0, 1, 2, 4, 5]]
    # equal scores: the lower position first
    assert select_top_reference(jnp.asarray([[2.0, 1.0, 2.0, 2.0]]), 2).tolist() == [[0, 2]]


@pytest.mark.parametrize("radix_bits", [1, 4])
def test_select_top_radix_bits(radix_bits):
    x = make("ties", (2, 900), seed=radix_bits)
    got = select_top(x, 300, impl="pallas_interpret", radix_bits=radix_bits, num_warps=2)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(select_top_reference(x, 300)))


def test_select_top_errors():
    x = jnp.zeros((2, 100), jnp.float32)
    with pytest.raises(ValueError, match="m=0 must be within 1..100"):
        select_top(x, 0, impl="pallas_interpret")
    with pytest.raises(ValueError, match="m=101 must be within"):
        select_top(x, 101, impl="pallas_interpret")
    with pytest.raises(ValueError, match="do not fit one program"):
        select_top(jnp.zeros((1, 20000)), 5, impl="pallas_interpret")
    with pytest.raises(ValueError, match="unknown select_top impl"):
        select_top(x, 5, impl="cuda")
    with pytest.raises(ValueError, match="radix_bits=3"):
        select_top(x, 5, impl="pallas_interpret", radix_bits=3)


@pytest.mark.parametrize("p,m", [(8192, 1024), (8192, 256), (16384, 1024)])
def test_select_top_triton_lowering_verifies(monkeypatch, p, m):
    """The vocabulary second stage's shapes at K = 1024 and 256 (15 depths, 128 chunks keeping 64,
    or 32 threshold chunks keeping 256) and the widest row lower for CUDA and verify."""
    modules = _verified_triton_modules(monkeypatch)
    try:
        jax.jit(lambda x: select_top(x, m, impl="pallas")).trace(
            jax.ShapeDtypeStruct((15, p), jnp.float32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()
