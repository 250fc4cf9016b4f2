"""ddtree_jax.kernels.select_top: the kernel (interpret mode) keeps exactly the reference sort's m
best positions, under both score orders and both tie rules, and lowers for CUDA."""
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
    tie = np.stack([rng.permutation(shape[-1]) for _ in range(int(np.prod(shape[:-1])))])
    return jnp.asarray(x), jnp.asarray((tie * 3 + 5).astype(np.int32).reshape(shape))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,m", [((3, 100), 7), ((2, 1000), 1000), ((1, 6238), 1023), ((2, 2, 37), 1)])
@pytest.mark.parametrize("with_tie", [False, True])
@pytest.mark.parametrize("zeros_equal", [False, True])
def test_select_top_equals_the_sort(kind, shape, m, with_tie, zeros_equal):
    """The positions of the m best (score desc; -0.0 below +0.0, or equal with zeros_equal; then
    by tie key or position), ascending, exactly as the reference's sort."""
    x, tie = make(kind, shape, seed=m + len(kind))
    tie = tie if with_tie else None
    got = select_top(x, m, tie, zeros_equal=zeros_equal, impl="pallas_interpret")
    want = select_top_reference(x, m, tie, zeros_equal)
    assert got.shape == (*shape[:-1], m) and got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_select_top_reference_by_hand():
    x = jnp.asarray([[1.0, 3.0, 3.0, -0.0, 0.0, 2.0]])
    assert select_top_reference(x, 3).tolist() == [[1, 2, 5]]
    assert select_top_reference(x, 4, jnp.asarray([[0, 5, 4, 3, 2, 1]])).tolist() == [[0, 1, 2, 5]]
    # total order: +0.0 beats -0.0; with zeros_equal the tie key decides (position 3 first)
    assert select_top_reference(x, 5).tolist() == [[0, 1, 2, 4, 5]]
    assert select_top_reference(x, 5, zeros_equal=True).tolist() == [[0, 1, 2, 3, 5]]


@pytest.mark.parametrize("radix_bits", [1, 4])
def test_select_top_radix_bits(radix_bits):
    x, tie = make("ties", (2, 900), seed=radix_bits)
    got = select_top(x, 300, tie, impl="pallas_interpret", radix_bits=radix_bits, num_warps=2)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(select_top_reference(x, 300, tie)))


def test_select_top_errors():
    x = jnp.zeros((2, 100), jnp.float32)
    with pytest.raises(ValueError, match="m=0 must be within 1..100"):
        select_top(x, 0, impl="pallas_interpret")
    with pytest.raises(ValueError, match="m=101 must be within"):
        select_top(x, 101, impl="pallas_interpret")
    with pytest.raises(ValueError, match="tie keys"):
        select_top(x, 5, jnp.zeros((2, 99), jnp.int32), impl="pallas_interpret")
    with pytest.raises(ValueError, match="do not fit one program"):
        select_top(jnp.zeros((1, 20000)), 5, impl="pallas_interpret")
    with pytest.raises(ValueError, match="unknown select_top impl"):
        select_top(x, 5, impl="cuda")
    with pytest.raises(ValueError, match="radix_bits=3"):
        select_top(x, 5, impl="pallas_interpret", radix_bits=3)


@pytest.mark.parametrize("p,m,with_tie", [(6238, 1023, True), (16384, 1024, True), (8192, 1024, False)])
def test_select_top_triton_lowering_verifies(monkeypatch, p, m, with_tie):
    """The tree build's shapes at budget 1024 (a depth's candidates, the final selection over all
    depths, the vocabulary second stage) lower for CUDA and their Triton modules verify."""
    modules = _verified_triton_modules(monkeypatch)
    def fn(x, *tie):
        return select_top(x, m, *tie, zeros_equal=with_tie, impl="pallas")

    args = [jax.ShapeDtypeStruct((15 if not with_tie else 1, p), jnp.float32)]
    if with_tie:
        args.append(jax.ShapeDtypeStruct((1, p), jnp.int32))
    try:
        jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()
