"""Top-`keep` of every chunk of a row as one Pallas kernel: the first stage of the tree build's
vocabulary top-k (``ddtree_jax.trees.ddtree.vocab_top_k``), and the second stage's prefilter.

Why: XLA's ``top_k`` on a GPU sorts: one ``lax.top_k`` over 15 depths x 151936 tokens took
0.59 ms on the H200 at every K, against a 0.3 ms target for the whole tree build.

How (``impl="threshold"``): a program holds one chunk in registers (1187 values of an 8B-shape
row, padded to 2048: 16 a thread) and builds the chunk's keep-th largest key a few bits at a time
(32 / radix_bits rounds of compare-and-count: the largest t with at least `keep` keys >= t), takes
every key above it and the lowest-index keys equal to it (a prefix count), and scatters the kept
values to their slots by a second prefix count: work that does not grow with `keep`, one read of
the chunk. 128 chunks keeping 64 take 0.096 ms on the H200 (an extraction of the maximum `keep`
times took 0.171).

Result: values and indices ``[..., chunks, keep]``: each chunk's top `keep` as ``lax.top_k``
chooses them (larger values first, equal values by lower index first), listed in **index order**
(ascending token index), not by rank. That is enough for the two-stage top-k: its second stage
ranks the candidates, and chunk-major index order is token order, so lax.top_k's
lower-position-first tie rule still picks the lower token. Keys are int32 in the float total
order that ``lax.top_k`` uses, so -0.0 ranks below +0.0. Positions past the row's end (the last
chunk's padding) count as -inf at their own index, as in the reference, which pads the row with
-inf. The tests run it in interpret mode against the reference and lower it for CUDA.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["chunk_top_k", "chunk_top_k_reference", "index_ordered", "order_key", "from_order_key", "top_k_total_order",
           "top_k_by_keys", "IMPLS", "RADIX_BITS"]

# Widest chunk one program holds (values in registers: 32 a thread on 4 warps).
_MAX_CHUNK = 4096


IMPLS = ("xla", "threshold", "threshold_interpret")


def order_key(x: jax.Array) -> jax.Array:
    """float32 -> int32 keys in the float total order that lax.top_k sorts by (-0.0 below +0.0);
    the map is its own inverse on the bits (`from_order_key`)."""
    bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    return jnp.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


def from_order_key(key: jax.Array) -> jax.Array:
    """The float32 values of `order_key` keys."""
    return lax.bitcast_convert_type(jnp.where(key < 0, key ^ 0x7FFFFFFF, key), jnp.float32)


def top_k_total_order(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`lax.top_k(x, k)` in the float total order (-0.0 below +0.0; equal values by lower
    index) on every backend: lax.top_k of the int32 `order_key`s (`top_k_by_keys`), since on the
    H200 XLA's GPU top_k ranks -0.0 and +0.0 as equal (the tree build's vocabulary top-k picked
    other tokens than the CPU on signed zeros).

    Float32 compiled for the CPU goes straight to lax.top_k, whose float order there is already
    this one (tests): XLA:CPU's top-k of int32 keys is ~100x slower ([15, 8192] at K = 16: 22 ms
    against 0.2, most of the shipped pair's whole CPU round). The platform the computation is
    lowered for picks the branch (lax.platform_dependent), not a device read while tracing."""
    if x.dtype != jnp.float32:
        return top_k_by_keys(x, k)
    return lax.platform_dependent(x, cpu=lambda x: tuple(lax.top_k(x, k)), default=lambda x: top_k_by_keys(x, k))


def top_k_by_keys(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """`top_k_total_order` on every backend alike: lax.top_k of the int32 `order_key`s."""
    key, pos = lax.top_k(order_key(x), k)
    return from_order_key(key).astype(x.dtype), pos


def kth_largest(key: jax.Array, valid: jax.Array, count, radix_bits: int) -> jax.Array:
    """Inside a kernel: the count-th largest of the int32 keys where `valid` (1 <= count <=
    #valid), i.e. the largest t with at least `count` valid keys >= t, built radix_bits bits a
    round from the top (32 / radix_bits rounds of 2**radix_bits counts, the counts one reduction)."""
    top = jnp.int32(-(2**31))   # the sign bit: an unsigned pattern u is the signed key u ^ top
    digit = jnp.arange(1 << radix_bits, dtype=jnp.int32)

    def radix_round(r, t):
        # t: the largest unsigned pattern so far with >= count keys at or above it (its low bits
        # zero). Try every digit d of the next radix_bits bits: cand_d = t | d << shift, whose
        # counts fall as d grows, and keep the largest d whose count is still >= count (d = 0 is
        # t itself, always; its column just keeps the shapes powers of two).
        shift = 32 - radix_bits * (r + 1)
        cand = t | lax.shift_left(digit, jnp.full(digit.shape, shift, jnp.int32))
        at_least = valid[:, None] & (key[:, None] >= (cand ^ top)[None, :])
        counts = jnp.sum(jnp.where(at_least, 1, 0), axis=0)                    # [2**radix_bits]
        best = jnp.sum(jnp.where(counts >= count, 1, 0)) - 1
        return t | lax.shift_left(best, shift)

    return lax.fori_loop(0, 32 // radix_bits, radix_round, jnp.int32(0)) ^ top


def take_by_position(key: jax.Array, valid: jax.Array, count, kth: jax.Array) -> jax.Array:
    """Inside a kernel: which of the valid keys are the `count` largest, given the count-th
    largest `kth`: all above it and the lowest-position ones equal to it (a prefix count)."""
    above = valid & (key > kth)
    tied = valid & (key == kth)
    need = count - jnp.sum(jnp.where(above, 1, 0))                 # >= 1 of the tied, lowest first
    return above | (tied & (jnp.cumsum(jnp.where(tied, 1, 0)) <= need))


def kept_slots(take: jax.Array, count: int, pad: int) -> jax.Array:
    """Inside a kernel: the output slot of every taken lane, in lane order (a prefix count). The
    lanes not taken point at a spare slot (min(count, pad - 1)): masked off, they store nothing
    on a GPU, but interpret mode writes their old values back, which must not land on a kept slot
    (so in interpret mode pad must exceed count)."""
    return jnp.where(take, jnp.cumsum(jnp.where(take, 1, 0)) - 1, min(count, pad - 1))


def index_ordered(impl: str) -> bool:
    """Whether `impl` returns each chunk's kept entries by token index (else by rank)."""
    return impl.startswith("threshold")


def chunk_top_k_reference(x: jax.Array, chunks: int, keep: int,
                          index_order: bool = False) -> tuple[jax.Array, jax.Array]:
    """XLA path: ``lax.top_k`` (in the float total order: `top_k_total_order`) of each of
    `chunks` contiguous slices of the last axis (padded
    with -inf). Returns (values, indices within the row) ``[..., chunks, keep]``, by rank, or
    by index with `index_order` (the threshold kernel's order)."""
    v = x.shape[-1]
    length = -(-v // chunks)
    pad = chunks * length - v
    xp = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)], constant_values=-jnp.inf) if pad else x
    vals, idx = top_k_total_order(xp.reshape(*x.shape[:-1], chunks, length), keep)
    idx = idx + (jnp.arange(chunks, dtype=jnp.int32) * length)[:, None]
    if index_order:
        order = jnp.argsort(idx, axis=-1)
        vals, idx = jnp.take_along_axis(vals, order, -1), jnp.take_along_axis(idx, order, -1)
    return vals, idx


def _threshold_kernel(x_ref, vals_ref, idx_ref, *, length: int, width: int, keep: int,
                      keep_pad: int, radix_bits: int):
    """One (row, chunk): x_ref [V] (the whole row), outputs [keep_pad] of this chunk, the kept
    entries in index order (see the module doc).

    keep_pad is the outputs' width: keep rounded up to a power of two, one more in interpret
    mode when that is keep itself (see `kept_slots`). radix_bits: key bits settled a round
    (32 / radix_bits rounds of 2**radix_bits - 1 counts each, the counts one reduction).
    """
    c = pl.program_id(1)
    lane = jnp.arange(width, dtype=jnp.int32)
    start = c * length
    pos = start + lane
    inchunk = lane < length
    x = pltriton.load(x_ref.at[jnp.minimum(pos, x_ref.shape[0] - 1)],
                      mask=inchunk & (pos < x_ref.shape[0]), other=-jnp.inf).astype(jnp.float32)
    key = order_key(x)                                       # the total order lax.top_k sorts by
    take = take_by_position(key, inchunk, keep, kth_largest(key, inchunk, keep, radix_bits))
    slot = kept_slots(take, keep, keep_pad)
    pltriton.store(vals_ref.at[slot], x.astype(vals_ref.dtype), mask=take)
    pltriton.store(idx_ref.at[slot], pos, mask=take)


RADIX_BITS = (1, 2, 4)


def chunk_top_k(x: jax.Array, chunks: int, keep: int, *, impl: str = "threshold", num_warps: int = 4,
                radix_bits: int = 2) -> tuple[jax.Array, jax.Array]:
    """Top-`keep` of each of `chunks` contiguous slices of the last axis of x [..., V].

    Returns (values in x.dtype, indices into the row, int32), each ``[..., chunks, keep]``.
    impl: "threshold" (the kernel: each slice's entries in index order), its "threshold_interpret"
    twin (the same kernel on any backend, for tests), or "xla" (the reference, rank order).
    num_warps: the kernel's warps a program; radix_bits (1, 2 or 4): key bits settled a round.
    Neither changes the result.
    """
    if impl == "xla":
        return chunk_top_k_reference(x, chunks, keep)
    if impl not in IMPLS:
        raise ValueError(f"unknown chunk_top_k impl {impl!r}; choose one of {', '.join(IMPLS)}")
    v = x.shape[-1]
    length = -(-v // chunks)
    width = _pow2_at_least(length)
    if radix_bits not in RADIX_BITS:
        raise ValueError(f"chunk_top_k: radix_bits={radix_bits}; choose one of {RADIX_BITS}")
    if width > _MAX_CHUNK or keep > length:
        raise ValueError(f"chunk_top_k: chunks of {length} values (keep {keep}) do not fit one program "
                         f"(at most {_MAX_CHUNK}, keep <= chunk); use more chunks or impl='xla'")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    lead = x.shape[:-1]
    rows = math.prod(lead)
    keep_pad = _pow2_at_least(keep)
    interpret = impl.endswith("_interpret")
    if interpret and keep == keep_pad:
        keep_pad += 1       # a spare slot for the masked-off lanes (see kept_slots)
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    kernel = functools.partial(_threshold_kernel, radix_bits=radix_bits)
    vals, idx = pl.pallas_call(
        functools.partial(kernel, length=length, width=width, keep=keep, keep_pad=keep_pad),
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
