"""pallas_kernels.chunk_topk: the per-chunk top-k kernel (interpret mode) is bit-exact with
lax.top_k per chunk, ties and signed zeros included, and lowers for CUDA."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.chunk_topk import chunk_top_k, chunk_top_k_reference, top_k_total_order
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
@pytest.mark.parametrize("shape,chunks,keep", [((2, 3, 1000), 7, 5), ((1, 2, 4096), 16, 64), ((3, 100), 4, 25),
                                               ((2, 37), 5, 8), ((1, 64), 2, 1)])
def test_chunk_top_k_bit_exact_with_lax_top_k(kind, shape, chunks, keep):
    x = make(kind, shape, seed=chunks * 31 + keep)
    got = chunk_top_k(x, chunks, keep, impl="pallas_interpret")
    want = chunk_top_k_reference(x, chunks, keep)
    assert got[0].shape == want[0].shape == (*shape[:-1], chunks, keep)
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.int32), np.asarray(want[0]).view(np.int32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


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
        chunk_top_k(x, 2, 8, impl="pallas_interpret")  # 10000-value chunks
    with pytest.raises(ValueError, match="keep <= chunk"):
        chunk_top_k(x[:, :40], 8, 6, impl="pallas_interpret")  # 5-value chunks, keep 6
    with pytest.raises(ValueError, match="unknown chunk_top_k impl"):
        chunk_top_k(x, 128, 8, impl="cuda")
    with pytest.raises(ValueError, match="radix_bits=3; choose one of"):
        chunk_top_k(x, 128, 8, impl="threshold_interpret", radix_bits=3)


@pytest.mark.parametrize("impl,options", [("pallas", {}), ("threshold", {}),
                                          ("threshold", dict(radix_bits=4, num_warps=2))])
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


PRUNED_KINDS = ("float", "ties", "neginf", "few_finite", "zeros", "rising")


def make_pruned(kind, shape, chunks, keep, seed):
    """Rows for impl="pruned": log-softmax rows; many exact ties (ties at tau: chunks with more
    than `keep` entries >= tau); -inf regions; fewer than `keep` chunks with a finite entry (tau
    = -inf); signed zeros; and rising rows (the last chunks hold the whole top, the radix path)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32) * 3
    x = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    v = shape[-1]
    length = -(-v // chunks)
    if kind == "ties":
        x = np.round(x)
    elif kind == "neginf":
        x[..., rng.random(v) < 0.5] = -np.inf
        x[..., v // 3:v // 2] = -np.inf
    elif kind == "few_finite":  # finite entries in fewer than `keep` chunks (none where keep is 1)
        finite = np.isin(np.arange(v) // length, rng.choice(chunks, size=keep - 1, replace=False))
        x = np.where(finite & (rng.random(v) < 0.3), np.round(x), -np.inf).astype(np.float32)
    elif kind == "zeros":
        x = np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(np.float32)
        x[..., rng.random(v) < 0.1] = -np.inf
    elif kind == "rising":
        x = np.broadcast_to(np.round(np.linspace(-20, 0, v), 1), shape).astype(np.float32)
    return x


def order_keys(x):
    bits = np.asarray(x, np.float32).view(np.int32)
    return np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def pruned_reference(x, chunks, keep):
    """numpy: impl="pruned"'s contract, row by row (module doc): values and indices [rows, chunks,
    keep], how many of each chunk's slots are real [rows, chunks], and tau's key [rows]."""
    rows, v = x.shape
    length = -(-v // chunks)
    key = order_keys(x)
    lowest = np.iinfo(np.int32).min
    vals = np.full((rows, chunks, keep), -np.inf, np.float32)
    idx = np.zeros((rows, chunks, keep), np.int32)
    real = np.zeros((rows, chunks), np.int32)
    taus = np.zeros(rows, np.int32)
    for r in range(rows):
        maxima = [key[r, c * length:(c + 1) * length].max(initial=lowest) for c in range(chunks)]
        taus[r] = tau = sorted(maxima, reverse=True)[keep - 1]
        for c in range(chunks):
            pos = np.arange(c * length, min((c + 1) * length, v))
            pos = pos[key[r, pos] >= tau]
            if len(pos) > keep:   # the keep best by (key desc, position asc), back in index order
                pos = np.sort(pos[np.lexsort((pos, -key[r, pos].astype(np.int64)))[:keep]])
            vals[r, c, :len(pos)], idx[r, c, :len(pos)], real[r, c] = x[r, pos], pos, len(pos)
            idx[r, c, len(pos):] = min((c + 1) * length, v) - 1
    return vals, idx, real, taus


@pytest.mark.parametrize("kind", PRUNED_KINDS)
@pytest.mark.parametrize("shape,chunks,keep", [((2, 1000), 16, 5), ((3, 517), 8, 8), ((1, 4100), 64, 64),
                                               ((2, 301), 40, 8), ((1, 900), 24, 1)])
def test_pruned_kernel_keeps_the_rows_top_keep(kind, shape, chunks, keep):
    """impl="pruned": each chunk lists its entries >= tau (the keep-th largest chunk maximum), or
    its `keep` best as "threshold" picks them, then fillers (-inf at the chunk's last in-row
    position); the top `keep` of the flattened candidates (ties by position) is exactly
    top_k_total_order(x, keep), values bitwise; every real candidate is >= tau, and tau is at most
    the row's keep-th value (real candidates may lie below that: tau's own chunk lists tau).
    Vocabularies are no multiple of chunks (4100 / 64: a last chunk of 5; 301 / 40: chunks 38 and
    39 past the row's end); keep from 1 to chunks."""
    x = make_pruned(kind, shape, chunks, keep, seed=chunks * 7 + keep)
    vals, idx = chunk_top_k(jnp.asarray(x), chunks, keep, impl="pruned_interpret")
    want_vals, want_idx, real, tau = pruned_reference(x, chunks, keep)
    np.testing.assert_array_equal(np.asarray(vals).view(np.int32), want_vals.view(np.int32))
    np.testing.assert_array_equal(np.asarray(idx), want_idx)
    rows = shape[0]
    top, pos = top_k_total_order(vals.reshape(rows, chunks * keep), keep)
    want_top, want_tok = top_k_total_order(jnp.asarray(x), keep)
    np.testing.assert_array_equal(np.asarray(top).view(np.int32), np.asarray(want_top).view(np.int32))
    np.testing.assert_array_equal(np.take_along_axis(np.asarray(idx).reshape(rows, -1), np.asarray(pos), -1),
                                  np.asarray(want_tok))
    is_real = np.arange(keep) < real[..., None]
    assert (order_keys(vals) >= tau[:, None, None])[is_real].all()
    assert (tau <= order_keys(np.asarray(want_top))[:, -1]).all() and (real.sum(axis=-1) >= keep).all()
    assert (np.asarray(vals)[~is_real] == -np.inf).all() and (np.asarray(idx) < shape[-1]).all()


def test_pruned_kernel_errors():
    x = jnp.zeros((2, 1000), jnp.float32)
    with pytest.raises(ValueError, match="needs keep <= chunks"):
        chunk_top_k(x, 8, 9, impl="pruned_interpret")
    with pytest.raises(ValueError, match="keep <= chunk"):
        chunk_top_k(x[:, :40], 8, 6, impl="pruned_interpret")  # 5-value chunks, keep 6
    with pytest.raises(ValueError, match="radix_bits=3; choose one of"):
        chunk_top_k(x, 8, 8, impl="pruned_interpret", radix_bits=3)


@pytest.mark.parametrize("options", [{}, dict(radix_bits=4, num_warps=8)])
def test_pruned_kernel_triton_lowering_verifies(monkeypatch, options):
    """impl="pruned" at the 8B shape (15 depths x 151936 tokens, 128 chunks, keep 64) lowers for
    CUDA: one Triton module (the chunk maxima are XLA), with the radix rounds under an scf.if."""
    modules = _verified_triton_modules(monkeypatch)
    fn = functools.partial(chunk_top_k, chunks=128, keep=64, impl="pruned", **options)
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((1, 15, 151936), jnp.float32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()
    assert "scf.if" in str(modules[0])
