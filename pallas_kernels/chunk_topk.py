"""Top-`keep` of every chunk of a row as one Pallas kernel: the first stage of the tree build's
vocabulary top-k (``ddtree_jax.trees.ddtree.vocab_top_k``).

Why: XLA's ``top_k`` on a GPU sorts. On the H200 the tree build's two-stage vocabulary top-k
(15 depths x 151936 tokens, 128 chunks) took 0.21-0.22 ms at every K (bench/RESULTS.md, session
4): most of the 0.35 ms build at budget 64 and a third of the 0.69 ms at 1024, against a 0.3 ms
target. Here a program holds one chunk in registers (1187 values of an 8B-shape row, padded to
2048: 16 a thread) and pulls its maximum out `keep` times: each step is one max and one
min-index reduction over the chunk, no sort and no memory traffic beyond one read of the chunk.

Result: values and indices ``[..., chunks, keep]`` with exactly ``lax.top_k``'s order on each
chunk: larger values first, equal values by lower index first (the min-index reduction), so the
caller's second stage sees the same candidates in the same order as with ``lax.top_k``. The
maximum is taken over int32 keys in the float total order that ``lax.top_k`` uses, so -0.0
ranks below +0.0 there too.
Positions past the row's end (the last chunk's padding) count as -inf at their own index, as in
the reference, which pads the row with -inf.

Status: selectable (``impl="pallas"``), not the default: not yet timed on a GPU
(``python -m bench.bench_tree --variants 128x64p`` does). The tests run it in interpret mode
against ``lax.top_k`` and lower it for CUDA.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["chunk_top_k", "chunk_top_k_reference"]

# Widest chunk one program holds (values in registers: 32 a thread on 4 warps).
_MAX_CHUNK = 4096


def chunk_top_k_reference(x: jax.Array, chunks: int, keep: int) -> tuple[jax.Array, jax.Array]:
    """XLA path: ``lax.top_k`` of each of `chunks` contiguous slices of the last axis (padded
    with -inf). Returns (values, indices within the row) ``[..., chunks, keep]``."""
    v = x.shape[-1]
    length = -(-v // chunks)
    pad = chunks * length - v
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=-jnp.inf) if pad else x
    vals, idx = lax.top_k(xp.reshape(*x.shape[:-1], chunks, length), keep)
    return vals, idx + (jnp.arange(chunks, dtype=jnp.int32) * length)[:, None]


def _kernel(x_ref, vals_ref, idx_ref, *, length: int, width: int, keep: int, keep_pad: int):
    """One (row, chunk): x_ref [V] (the whole row), outputs [keep_pad] of this chunk."""
    c = pl.program_id(1)
    lane = jnp.arange(width, dtype=jnp.int32)
    start = c * length
    pos = start + lane
    valid = (lane < length) & (pos < x_ref.shape[0])
    x = pltriton.load(x_ref.at[jnp.minimum(pos, x_ref.shape[0] - 1)], mask=valid,
                      other=-jnp.inf).astype(jnp.float32)
    # float32 -> int32 keys in the total order lax.top_k sorts by (-0.0 below +0.0)
    bits = lax.bitcast_convert_type(x, jnp.int32)
    key = jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    slot = jnp.arange(keep_pad, dtype=jnp.int32)
    lowest = jnp.iinfo(jnp.int32).min

    def step(i, carry):
        alive, best, idx = carry
        ka = jnp.where(alive, key, lowest)
        m = jnp.max(ka)
        # the lowest live lane holding the maximum (lax.top_k's tie rule; `alive`, not the
        # value, marks what was taken, so repeated -inf keys are taken one by one)
        j = jnp.min(jnp.where(alive & (ka == m), lane, width))
        best = jnp.where(slot == i, m, best)
        idx = jnp.where(slot == i, start + j, idx)
        return alive & (lane != j), best, idx

    best0 = jnp.full((keep_pad,), lowest, jnp.int32)
    idx0 = jnp.zeros((keep_pad,), jnp.int32)
    _, best, idx = lax.fori_loop(0, keep, step, (lane < length, best0, idx0))
    vals = lax.bitcast_convert_type(jnp.where(best < 0, best ^ 0x7FFFFFFF, best), jnp.float32)
    vals_ref[...] = vals.astype(vals_ref.dtype)
    idx_ref[...] = idx


def chunk_top_k(x: jax.Array, chunks: int, keep: int, *, impl: str = "pallas") -> tuple[jax.Array, jax.Array]:
    """Top-`keep` of each of `chunks` contiguous slices of the last axis of x [..., V].

    Returns (values in x.dtype, indices into the row, int32), each ``[..., chunks, keep]``,
    ordered as ``lax.top_k`` orders each slice. impl: "pallas" (the GPU kernel),
    "pallas_interpret" (the same kernel on any backend, for tests) or "xla" (the reference).
    """
    if impl == "xla":
        return chunk_top_k_reference(x, chunks, keep)
    if impl not in ("pallas", "pallas_interpret"):
        raise ValueError(f"unknown chunk_top_k impl {impl!r}; choose pallas, pallas_interpret or xla")
    v = x.shape[-1]
    length = -(-v // chunks)
    width = _pow2_at_least(length)
    if width > _MAX_CHUNK or keep > length:
        raise ValueError(f"chunk_top_k: chunks of {length} values (keep {keep}) do not fit one program "
                         f"(at most {_MAX_CHUNK}, keep <= chunk); use more chunks or impl='xla'")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    lead = x.shape[:-1]
    rows = math.prod(lead)
    keep_pad = _pow2_at_least(keep)
    interpret = impl == "pallas_interpret"
    params = None if interpret else pltriton.CompilerParams(num_warps=4, num_stages=1)
    vals, idx = pl.pallas_call(
        functools.partial(_kernel, length=length, width=width, keep=keep, keep_pad=keep_pad),
        grid=(rows, chunks),
        in_specs=[pl.BlockSpec((None, v), lambda r, c: (r, 0))],
        out_specs=[pl.BlockSpec((None, None, keep_pad), lambda r, c: (r, c, 0)),
                   pl.BlockSpec((None, None, keep_pad), lambda r, c: (r, c, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, chunks, keep_pad), x.dtype),
                   jax.ShapeDtypeStruct((rows, chunks, keep_pad), jnp.int32)],
        compiler_params=params,
        interpret=interpret,
        name="chunk_top_k",
    )(x.reshape(rows, v))
    vals = vals[..., :keep].reshape(*lead, chunks, keep)
    idx = idx[..., :keep].reshape(*lead, chunks, keep)
    return vals, idx
