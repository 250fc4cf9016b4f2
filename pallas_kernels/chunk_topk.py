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

A third, ``impl="pruned"`` (not timed yet), keeps fewer candidates, under a
**different contract**, for the first stage of a top K with keep == K <= chunks only. Why: the
threshold kernel runs its 32 / radix_bits rounds in every one of the 15 x 128 programs (34 us on
the H200 for a 9 MB read), though the row's top K lie in at most K chunks. Let M_c be the
largest key of chunk c and tau the keep-th largest of the row's M_c. Each of the keep chunks
with M_c >= tau holds an entry >= tau, so the row's top `keep` are all >= tau, and a chunk
needs only its entries >= tau: most hold one or none, and only a chunk with more than `keep`
of them runs the radix rounds (a ``lax.cond`` in the kernel: scf.if on the GPU). The maxima are
one XLA fusion in front (`chunk_maxima`); each program computes tau from its row's maxima (a
[chunks, chunks] compare), counts its keys >= tau, and takes them all or the threshold
kernel's `keep` best of them.

Its result, ``[..., chunks, keep]`` as "threshold" (index order in a chunk): a chunk lists its
entries whose `order_key` is >= tau's (more than `keep`: its `keep` best, as "threshold" picks
them), then fillers in the slots left: value -inf, index the chunk's last in-row position
(``min((c + 1) * length, V) - 1``: chunk-major candidates stay in token order). Padding past the
row's end is never a real entry (maxima of chunks wholly past the end are INT32_MIN, below
every key; such chunks hold fillers only). Guarantee: the real entries include the row's top
`keep` under lax.top_k's order, so the top `keep` of the flattened candidates by (value desc
in the total order, then index or position asc) is exactly ``top_k_total_order(x, keep)``.
Where tau > -inf every filler ranks below every real entry. Where tau = -inf (fewer than `keep`
chunks with a finite maximum) every in-row entry is >= tau, so a chunk with at least `keep`
in-row entries lists `keep` real ones; fillers appear only in a last chunk cut by the row's end
(or chunks wholly past it), after every real entry at -inf that the top `keep` can reach, and a
filler equal to a real (-inf, V - 1) can only stand in for it as the last of the top `keep`.
Not covered: rows with negative-sign NaNs (keys below -inf's).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["chunk_top_k", "chunk_top_k_reference", "chunk_maxima", "index_ordered", "order_key", "from_order_key",
           "top_k_total_order", "IMPLS"]

# Widest chunk one program holds (values in registers: 32 a thread on 4 warps).
_MAX_CHUNK = 4096


IMPLS = ("xla", "pallas", "pallas_interpret", "threshold", "threshold_interpret", "pruned", "pruned_interpret")


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
    index) on every backend: lax.top_k of the int32 `order_key`s. On the CPU lax.top_k of floats
    orders so already; on the H200 XLA's GPU top_k ranks -0.0 and +0.0 as equal (session 15:
    the tree build's vocabulary top-k picked other tokens than the CPU on signed zeros)."""
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
    return impl.startswith(("threshold", "pruned"))


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
    pos, inchunk, _, x = _load_chunk(x_ref, length, width)
    key = order_key(x)                                       # signed total order, as _kernel
    take = take_by_position(key, inchunk, keep, kth_largest(key, inchunk, keep, radix_bits))
    _store_taken(vals_ref, idx_ref, take, x, pos, keep, keep_pad)


def _load_chunk(x_ref, length: int, width: int):
    """Inside a kernel: this program's chunk (program_id(1)) of the row x_ref [V] in `width`
    lanes: (positions in the row, lanes inside the chunk, lanes inside the row, float32 values;
    -inf past either end)."""
    lane = jnp.arange(width, dtype=jnp.int32)
    pos = pl.program_id(1) * length + lane
    inchunk = lane < length
    inrow = inchunk & (pos < x_ref.shape[0])
    x = pltriton.load(x_ref.at[jnp.minimum(pos, x_ref.shape[0] - 1)], mask=inrow,
                      other=-jnp.inf).astype(jnp.float32)
    return pos, inchunk, inrow, x


def _store_taken(vals_ref, idx_ref, take, x, pos, keep: int, keep_pad: int):
    """Inside a kernel: the taken lanes' values and positions to the first slots, in lane order
    (`kept_slots`)."""
    slot = kept_slots(take, keep, keep_pad)
    pltriton.store(vals_ref.at[slot], x.astype(vals_ref.dtype), mask=take)
    pltriton.store(idx_ref.at[slot], pos, mask=take)


def _pruned_kernel(x_ref, max_ref, vals_ref, idx_ref, *, length: int, width: int, keep: int,
                   keep_pad: int, radix_bits: int):
    """One (row, chunk) of impl="pruned" (see the module doc): max_ref [chunks_pad] holds the
    row's chunk maxima as `order_key`s (INT32_MIN for a chunk past the row's end and for the
    padding up to a power of two), the rest as _threshold_kernel.

    tau, the keep-th largest chunk maximum, is the largest maximum M_c with at least `keep`
    maxima >= M_c (a [chunks_pad, chunks_pad] compare and one reduction; the INT32_MIN padding
    only adds to the counts of maxima equal to INT32_MIN, which can be tau only where it is the
    keep-th largest anyway). The chunk lists its in-row keys >= tau; where there are more than
    `keep`, the threshold kernel's keep best of them (`lax.cond`: scf.if, the radix rounds run
    only there). Fillers (-inf at the chunk's last in-row position) take the remaining slots by
    a second masked store to other slots than the first's.
    """
    m = max_ref[...]
    count_ge = jnp.sum(jnp.where(m[None, :] >= m[:, None], 1, 0), axis=1)    # [chunks_pad]
    tau = jnp.max(jnp.where(count_ge >= keep, m, jnp.iinfo(jnp.int32).min))
    pos, _, inrow, x = _load_chunk(x_ref, length, width)
    key = order_key(x)
    above = inrow & (key >= tau)
    n = jnp.sum(jnp.where(above, 1, 0))
    take = lax.cond(n > keep,
                    lambda: take_by_position(key, inrow, keep, kth_largest(key, inrow, keep, radix_bits)),
                    lambda: above)
    _store_taken(vals_ref, idx_ref, take, x, pos, keep, keep_pad)
    slot = jnp.arange(keep_pad, dtype=jnp.int32)
    filler = (slot >= jnp.minimum(n, keep)) & (slot < keep)   # the slots the first store left
    last = jnp.minimum((pl.program_id(1) + 1) * length, x_ref.shape[0]) - 1   # its last in-row position
    pltriton.store(vals_ref.at[slot], jnp.full((keep_pad,), -jnp.inf, vals_ref.dtype), mask=filler)
    pltriton.store(idx_ref.at[slot], jnp.full((keep_pad,), last, jnp.int32), mask=filler)


RADIX_BITS = (1, 2, 4)


def chunk_maxima(x: jax.Array, chunks: int) -> jax.Array:
    """XLA (one fusion): the largest `order_key` of each of `chunks` contiguous slices of the
    rows x [R, V], int32 [R, chunks rounded up to a power of two]; INT32_MIN (below every
    float's key but one negative NaN's) where a slice holds no entry of the row: past its end,
    and the padding up to the power of two."""
    rows, v = x.shape
    length = -(-v // chunks)
    lowest = jnp.iinfo(jnp.int32).min
    key = jnp.pad(order_key(x), [(0, 0), (0, chunks * length - v)], constant_values=lowest)
    m = key.reshape(rows, chunks, length).max(axis=-1)
    return jnp.pad(m, [(0, 0), (0, _pow2_at_least(chunks) - chunks)], constant_values=lowest)


def chunk_top_k(x: jax.Array, chunks: int, keep: int, *, impl: str = "pallas", num_warps: int = 4,
                radix_bits: int = 2) -> tuple[jax.Array, jax.Array]:
    """Top-`keep` of each of `chunks` contiguous slices of the last axis of x [..., V].

    Returns (values in x.dtype, indices into the row, int32), each ``[..., chunks, keep]``.
    impl: "pallas" (the extraction kernel: each slice ordered as ``lax.top_k`` orders it),
    "threshold" (the threshold kernel: the same entries, each slice in index order), each with
    an "_interpret" twin (the same kernel on any backend, for tests), or "xla" (the reference,
    rank order). num_warps: the kernel's warps a program; radix_bits (threshold and pruned, 1, 2
    or 4): key bits settled a round. Neither changes the result, and neither has been timed.

    "pruned" (and "pruned_interpret") keeps fewer candidates, by another contract (module doc):
    for keep == K of the caller's top K only, keep <= chunks (ValueError otherwise). tau: the
    keep-th largest of the row's chunk maxima (in `order_key` order). A chunk lists, in index
    order, its entries whose key is >= tau's, or where more than `keep` are, its `keep` best as
    "threshold" picks them; the slots left hold fillers (value -inf, index the chunk's last
    in-row position). Guarantee: the real entries include the row's top `keep`
    (`top_k_total_order(x, keep)`), so the top `keep` of the flattened candidates by (value
    desc in the total order, index or position asc) is exactly that: fillers rank below every
    real entry where tau > -inf and do not displace one otherwise (module doc; rows with negative
    NaNs excepted). Padding past the row's end is never a real entry.
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
    pruned = impl.startswith("pruned")
    if pruned and keep > chunks:
        raise ValueError(f"chunk_top_k: impl={impl!r} needs keep <= chunks (keep {keep}, chunks {chunks})")
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
    operands = [x.reshape(rows, v)]
    in_specs = [pl.BlockSpec((None, v), lambda r, c: (r, 0))]
    if index_ordered(impl):
        kernel = functools.partial(_pruned_kernel if pruned else _threshold_kernel, radix_bits=radix_bits)
        if interpret and keep == keep_pad:
            keep_pad += 1       # a spare slot for the masked-off lanes (see _threshold_kernel)
    if pruned:
        operands.append(chunk_maxima(operands[0], chunks))
        in_specs.append(pl.BlockSpec((None, operands[1].shape[1]), lambda r, c: (r, 0)))
    vals, idx = pl.pallas_call(
        functools.partial(kernel, length=length, width=width, keep=keep, keep_pad=keep_pad),
        grid=(rows, chunks),
        in_specs=in_specs,
        out_specs=[pl.BlockSpec((None, None, keep_pad), lambda r, c: (r, c, 0)),
                   pl.BlockSpec((None, None, keep_pad), lambda r, c: (r, c, 0))],
        out_shape=[jax.ShapeDtypeStruct((rows, chunks, keep_pad), x.dtype),
                   jax.ShapeDtypeStruct((rows, chunks, keep_pad), jnp.int32)],
        compiler_params=params,
        interpret=interpret,
        name="chunk_top_k",
    )(*operands)
    vals = vals[..., :keep].reshape(*lead, chunks, keep)
    idx = idx[..., :keep].reshape(*lead, chunks, keep)
    return vals, idx
