"""Rank of every candidate of a row by pairwise count, as one Pallas kernel: the tree build's
selections (``ddtree_jax.trees.ddtree.select_best`` and ``_lex_rank``) for short candidate lists.

    rank[b, i] = #{j : s[b, j] > s[b, i]  or  (s[b, j] == s[b, i] and k[b, j] < k[b, i])}

i.e. the position of candidate i under (score desc, key asc); a permutation of 0..P-1 when the
keys of a row are distinct (and no score is NaN).

Why: XLA computes the pairwise comparison as a [Bt, P, P] pred and sums it; in the H200 HLO the
comparison is written to memory by one kernel and summed by a second (at budget 1024 a depth
has P ~ 7100 candidates: ~50 MB written and read back per depth, 14 depths). Here a program
holds `block_i` candidates i (as a [block_i, 1] column), walks the whole row's j in blocks of
`block_j` columns (``lax.fori_loop``, each block sliced from the row with ``pl.ds``), adds the
[block_i, block_j] comparison into an int32 accumulator of the same shape and sums it over j
once at the end. Only the [Bt, P] int32 result is written.

Comparisons are plain float compares, as in the reference: -0.0 == +0.0, -inf ties -inf, and a
NaN neither beats nor ties anything (so it counts for no one, and ranks 0 itself).
The wrapper pads P to a multiple of the blocks with score -inf and key INT32_MAX. A padded j
never counts for a real i: ``-inf > s`` is false for every s, and on a tie (a real -inf)
``INT32_MAX < k`` is false for every int32 k. So the result equals the reference for any input;
real keys below INT32_MAX are needed only for the keys to be distinct from the padding's, which
the count does not rely on. Padded rows i are dropped.

Defaults (block_i 32, block_j 128, 4 warps, 2 stages) are untimed guesses: a [32, 128] int32
accumulator is 32 registers a thread on 4 warps. Time them with
``python -m bench.bench_tree --rank-impl xla,pallas``.

Status: selectable (``ddtree.RANK_IMPL`` / ``DDTREE_RANK_IMPL``), not the default. Timed once
(session 8, H200, these defaults): the whole tree build with it 0.313 / 0.478 / 0.701 ms at
B = 64 / 256 / 1024 against 0.269 / 0.404 / 0.617 with XLA's comparison, so slower at every
size; block sizes and warps are untuned (``rank_by_count``'s arguments). The tests run it in
interpret mode against the reference and lower it for CUDA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["rank_by_count", "rank_by_count_reference"]

_BLOCK_I = 32
_BLOCK_J = 128
_NUM_WARPS = 4
_NUM_STAGES = 2
_INT32_MAX = jnp.iinfo(jnp.int32).max


def rank_by_count_reference(scores: jax.Array, keys: jax.Array) -> jax.Array:
    """XLA path: the pairwise comparison [Bt, P, P], summed over j. int32[Bt, P]."""
    si, sj = scores[:, :, None], scores[:, None, :]
    better = (sj > si) | ((sj == si) & (keys[:, None, :] < keys[:, :, None]))
    return better.sum(-1, dtype=jnp.int32)


def _kernel(s_ref, k_ref, o_ref, *, block_i: int, block_j: int, steps: int):
    """One (row, block of i): s_ref / k_ref [Pp] (the whole padded row), o_ref [block_i]."""
    i0 = pl.multiple_of(pl.program_id(1) * block_i, block_i)
    si = s_ref[pl.ds(i0, block_i)][:, None]  # [block_i, 1]
    ki = k_ref[pl.ds(i0, block_i)][:, None]

    def step(j, acc):
        j0 = pl.multiple_of(j * block_j, block_j)
        sj = s_ref[pl.ds(j0, block_j)][None, :]  # [1, block_j]
        kj = k_ref[pl.ds(j0, block_j)][None, :]
        better = (sj > si) | ((sj == si) & (kj < ki))
        return acc + better.astype(jnp.int32)

    acc = lax.fori_loop(0, steps, step, jnp.zeros((block_i, block_j), jnp.int32))
    o_ref[...] = jnp.sum(acc, axis=1)


def _block(name: str, value: int | None, default: int, p: int) -> int:
    b = default if value is None else int(value)
    if b < 1 or b & (b - 1):
        raise ValueError(f"rank_by_count: {name} must be a power of two, got {value}")
    return min(b, _pow2_at_least(p))  # a short row: one block, no wider than the row rounded up


def rank_by_count(scores: jax.Array, keys: jax.Array, *, impl: str = "pallas",
                  block_i: int | None = None, block_j: int | None = None,
                  num_warps: int | None = None) -> jax.Array:
    """rank[b, i] = #{j : s[b,j] > s[b,i] or (s[b,j] == s[b,i] and k[b,j] < k[b,i])}.

    scores float[Bt, P] (compared as float32), keys int32[Bt, P]. Returns int32[Bt, P]: the
    position of each candidate under (score desc, key asc), a permutation of 0..P-1 when each
    row's keys are distinct. impl: "pallas" (the GPU kernel), "pallas_interpret" (the same
    kernel on any backend, for tests) or "xla" (the reference). block_i / block_j (powers of
    two; capped at P rounded up to a power of two) and num_warps only affect the kernel.
    """
    if scores.ndim != 2 or scores.shape != keys.shape:
        raise ValueError(f"rank_by_count: scores and keys must both be [Bt, P], got {scores.shape} and {keys.shape}")
    if keys.dtype != jnp.int32:
        raise ValueError(f"rank_by_count: keys must be int32, got {keys.dtype}")
    if impl == "xla":
        return rank_by_count_reference(scores, keys)
    if impl not in ("pallas", "pallas_interpret"):
        raise ValueError(f"unknown rank_by_count impl {impl!r}; choose pallas, pallas_interpret or xla")
    bt, p = scores.shape
    bi = _block("block_i", block_i, _BLOCK_I, p)
    bj = _block("block_j", block_j, _BLOCK_J, p)
    if bt == 0 or p == 0:
        return jnp.zeros((bt, p), jnp.int32)
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    width = -(-p // max(bi, bj)) * max(bi, bj)  # both powers of two: a multiple of each
    s = scores.astype(jnp.float32)
    k = keys
    if width > p:
        s = jnp.pad(s, ((0, 0), (0, width - p)), constant_values=-jnp.inf)
        k = jnp.pad(k, ((0, 0), (0, width - p)), constant_values=_INT32_MAX)
    interpret = impl == "pallas_interpret"
    params = None if interpret else pltriton.CompilerParams(
        num_warps=_NUM_WARPS if num_warps is None else num_warps, num_stages=_NUM_STAGES)
    row = pl.BlockSpec((None, width), lambda b, i: (b, 0))
    rank = pl.pallas_call(
        functools.partial(_kernel, block_i=bi, block_j=bj, steps=width // bj),
        grid=(bt, width // bi),
        in_specs=[row, row],
        out_specs=pl.BlockSpec((None, bi), lambda b, i: (b, i)),
        out_shape=jax.ShapeDtypeStruct((bt, width), jnp.int32),
        compiler_params=params,
        interpret=interpret,
        name="rank_by_count",
    )(s, k)
    return rank[:, :p] if width > p else rank
