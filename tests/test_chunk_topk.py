"""ddtree_jax.kernels.chunk_topk: the per-chunk top-k threshold kernel (interpret mode) keeps
lax.top_k's entries of every chunk bit for bit, ties and signed zeros included, and lowers for
CUDA; top_k_total_order is lax.top_k in the float total order."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels.chunk_topk import (chunk_top_k, chunk_top_k_reference, from_order_key, order_key,
                                      top_k_by_keys, top_k_total_order)
from test_kernels import _verified_triton_modules

KINDS = ("float", "ties", "neginf", "zeros")


def make(kind, shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    if kind == "ties":
        x = np.round(x * 2) / 2
    elif kind == "neginf":
        x[..., ::3] = -np.inf
    elif kind == "zeros":  # +0.0 and -0.0: lax.top_k ranks -0.0 below +0.0
        x = np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(np.float32)
    return jnp.asarray(x)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,k", [((2, 3, 1000), 5), ((1, 15, 8192), 16), ((3, 100), 100), ((2, 37), 1)])
def test_top_k_total_order_equals_the_int_key_top_k(kind, shape, k):
    """top_k_total_order (compiled for the CPU: lax.top_k of the floats themselves, ~100x faster
    than of int32 keys) and top_k_by_keys (its branch on every other platform, run here too) give
    the int32 order keys' top k bit for bit: -0.0 below +0.0, equal values by lower index, -inf
    last."""
    x = make(kind, shape, seed=k)
    key, pos = jax.lax.top_k(order_key(x), k)
    for fn in (top_k_total_order, top_k_by_keys):
        got = jax.jit(fn, static_argnums=1)(x, k)
        np.testing.assert_array_equal(np.asarray(got[0]).view(np.int32),
                                      np.asarray(from_order_key(key).astype(x.dtype)).view(np.int32))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(pos))


def test_top_k_total_order_branches_by_the_lowering_platform():
    """The CPU's branch is lax.top_k of the floats, every other platform's the int32 keys' (no
    device is read while tracing: the platform the computation is lowered for picks)."""
    x = jax.ShapeDtypeStruct((2, 64), jnp.float32)
    lowered = {platform: jax.jit(top_k_total_order, static_argnums=1).trace(x, 4).lower(
        lowering_platforms=(platform,)).as_text() for platform in ("cpu", "cuda")}
    assert "bitcast_convert" not in lowered["cpu"] and "bitcast_convert" in lowered["cuda"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape,chunks,keep", [((2, 3, 1000), 7, 5), ((1, 2, 4096), 16, 64), ((3, 100), 4, 25),
                                               ((2, 37), 5, 8), ((1, 64), 2, 1), ((1, 1187 * 3), 3, 64)])
def test_threshold_kernel_keeps_the_same_entries_in_index_order(kind, shape, chunks, keep):
    """impl="threshold": each chunk's top `keep` (lax.top_k's set: ties at the keep-th value go to
    the lower index, -0.0 below +0.0), listed by token index; bit-exact with the reference in
    that order. The last shape is an 8B vocabulary's chunk (1187 values in 2048 lanes)."""
    x = make(kind, shape, seed=chunks * 17 + keep)
    got = chunk_top_k(x, chunks, keep, impl="threshold_interpret")
    want = chunk_top_k_reference(x, chunks, keep, index_order=True)
    assert got[0].shape == want[0].shape == (*shape[:-1], chunks, keep)
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.int32), np.asarray(want[0]).view(np.int32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("radix_bits", [1, 4])
@pytest.mark.parametrize("kind", ["ties", "zeros"])
@pytest.mark.parametrize("shape,chunks,keep", [((2, 3, 1000), 7, 5), ((1, 1187 * 2), 2, 64)])
def test_threshold_kernel_radix_bits(kind, shape, chunks, keep, radix_bits):
    """Every radix (key bits settled a round; the default 2 is the test above) finds the same
    keep-th key and so the same entries."""
    x = make(kind, shape, seed=chunks + keep + radix_bits)
    got = chunk_top_k(x, chunks, keep, impl="threshold_interpret", radix_bits=radix_bits, num_warps=2)
    want = chunk_top_k_reference(x, chunks, keep, index_order=True)
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.int32), np.asarray(want[0]).view(np.int32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_chunk_top_k_errors():
    x = jnp.zeros((2, 20000), jnp.float32)
    with pytest.raises(ValueError, match="do not fit one program"):
        chunk_top_k(x, 2, 8, impl="threshold_interpret")  # 10000-value chunks
    with pytest.raises(ValueError, match="keep <= chunk"):
        chunk_top_k(x[:, :40], 8, 6, impl="threshold_interpret")  # 5-value chunks, keep 6
    with pytest.raises(ValueError, match="unknown chunk_top_k impl"):
        chunk_top_k(x, 128, 8, impl="pallas")
    with pytest.raises(ValueError, match="radix_bits=3; choose one of"):
        chunk_top_k(x, 128, 8, impl="threshold_interpret", radix_bits=3)


@pytest.mark.parametrize("impl,options", [("threshold", {}), ("threshold", dict(radix_bits=4, num_warps=2))])
def test_chunk_top_k_triton_lowering_verifies(monkeypatch, impl, options):
    """The 8B shape's first stage (15 depths x 151936 tokens, 128 chunks, 64 kept) lowers for CUDA
    and its Triton module verifies, on a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    fn = functools.partial(chunk_top_k, chunks=128, keep=64, impl=impl, **options)
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((1, 15, 151936), jnp.float32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


def test_second_stage_shape_lowering_verifies(monkeypatch):
    """The vocabulary top-k's threshold second stage at K = 64 (15 rows of 128 x 64 candidates,
    chunks of 1024 keeping 64) lowers for CUDA and its Triton module verifies."""
    modules = _verified_triton_modules(monkeypatch)
    fn = functools.partial(chunk_top_k, chunks=8, keep=64, impl="threshold")
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((1, 15, 8192), jnp.float32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()
