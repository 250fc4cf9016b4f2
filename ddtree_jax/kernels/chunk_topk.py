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

Status: the GPU default where a chunk keeps at most 64 in sessions 8-10; the threshold
kernel below replaced it in session 11. The tests run it in interpret mode against ``lax.top_k`` and lower it for CUDA.

A second kernel, ``impl="threshold"`` (session 10), finds the same set with work that does not
grow with `keep`. The extraction above runs `keep` rounds of two block reductions over the
chunk (~150 instructions a thread a round, and two CTA-wide syncs); the H200 round profile of
DDTree-64 has it at 0.105 ms for 15 x 128 chunks keeping 64, ~40x the read of the logits. The
threshold kernel builds the chunk's keep-th largest key a few bits at a time (32 / radix_bits
rounds of compare-and-count: the largest t with at least `keep` keys >= t), takes every key
above it and the lowest-index keys equal to it (a prefix count), and scatters the kept values
to their slots by a second prefix count: in **index order** (ascending token index), not by
rank. That is enough for the two-stage top-k: its second stage sorts the candidates, and
chunk-major index order is token order, so lax.top_k's lower-position-first tie rule still
picks the lower token. The GPU default since session 11 (``ddtree.VOCAB_TOPK``): on the H200,
128 chunks keeping 64 took 0.096 ms against the extraction's 0.171, and the whole tree build at
B = 64 0.208 against 0.276 ms (``python -m bench.bench_tree --variants 128x64p,128x64t``).
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
           "IMPLS"]

# Widest chunk one program holds (values in registers: 32 a thread on 4 warps).
_MAX_CHUNK = 4096


IMPLS = ("xla", "pallas", "pallas_interpret", "threshold", "threshold_interpret")


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
    index) on every backend: lax.top_k of the int32 `order_key`s, since on the H200 XLA's GPU
    top_k ranks -0.0 and +0.0 as equal (session 15: the tree build's vocabulary top-k picked
    other tokens than the CPU on signed zeros).

    Float32 on the CPU goes straight to lax.top_k, whose float order there is already this one
    (tests): XLA:CPU's top-k of int32 keys is ~100x slower (session 37, [15, 8192] at K = 16:
    22 ms against 0.2, most of the shipped pair's whole CPU round)."""
    if jax.default_backend() == "cpu" and x.dtype == jnp.float32:
        vals, pos = lax.top_k(x, k)
        return vals, pos
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


def _kernel(x_ref, vals_ref, idx_ref, *, length: int, width: int, keep: int, keep_pad: int):
    """One (row, chunk): x_ref [V] (the whole row), outputs [keep_pad] of this chunk."""
    c = pl.program_id(1)
    lane = jnp.arange(width, dtype=jnp.int32)
    start = c * length
    pos = start + lane
    valid = (lane < length) & (pos < x_ref.shape[0])
    x = pltriton.load(x_ref.at[jnp.minimum(pos, x_ref.shape[0] - 1)], mask=valid,
                      other=-jnp.inf).astype(jnp.float32)
    key = order_key(x)   # the total order lax.top_k sorts by (-0.0 below +0.0)
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
    vals = from_order_key(best)
    vals_ref[...] = vals.astype(vals_ref.dtype)
    idx_ref[...] = idx


def _threshold_kernel(x_ref, vals_ref, idx_ref, *, length: int, width: int, keep: int,
                      keep_pad: int, radix_bits: int):
    """One (row, chunk), as _kernel, but the kept entries in index order (see the module doc).

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
    key = order_key(x)                                       # signed total order, as _kernel
    take = take_by_position(key, inchunk, keep, kth_largest(key, inchunk, keep, radix_bits))
    slot = kept_slots(take, keep, keep_pad)
    pltriton.store(vals_ref.at[slot], x.astype(vals_ref.dtype), mask=take)
    pltriton.store(idx_ref.at[slot], pos, mask=take)


RADIX_BITS = (1, 2, 4)


def chunk_top_k(x: jax.Array, chunks: int, keep: int, *, impl: str = "pallas", num_warps: int = 4,
                radix_bits: int = 2) -> tuple[jax.Array, jax.Array]:
    """Top-`keep` of each of `chunks` contiguous slices of the last axis of x [..., V].

    Returns (values in x.dtype, indices into the row, int32), each ``[..., chunks, keep]``.
    impl: "pallas" (the extraction kernel: each slice ordered as ``lax.top_k`` orders it),
    "threshold" (the threshold kernel: the same entries, each slice in index order), each with
    an "_interpret" twin (the same kernel on any backend, for tests), or "xla" (the reference,
    rank order). num_warps: the kernel's warps a program; radix_bits (threshold only, 1, 2 or 4):
    key bits settled a round. Neither changes the result, and neither has been timed.
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
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    kernel = _kernel
    if index_ordered(impl):
        kernel = functools.partial(_threshold_kernel, radix_bits=radix_bits)
        if interpret and keep == keep_pad:
            keep_pad += 1       # a spare slot for the masked-off lanes (see _threshold_kernel)
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
