"""The n best entries of each row, best first, under (score desc, position asc), when the row is
a concatenation of runs that are each already sorted best first: rank by binary search, one
Pallas kernel.

Why: DDTree's final selection at budget 1024 ranks ~14.3k entries (14 depths' kept candidates,
each depth's run ~1023 wide and sorted by its own selection) and keeps 1024. A pairwise rank
compares every entry with every other one (O(T^2), 44-46 us on the H200); but within a sorted run
an entry's rank is its offset, and the number of a run's entries that beat it is a binary search.
So an entry at run d, offset p, score v has the rank

    p + sum over runs d2 < d of #{x in d2 : x >= v} + sum over runs d2 > d of #{x in d2 : x > v}

(earlier runs win ties: the order of (score desc, position asc) over the whole row).
Program (row, tile) holds TI entries and searches all runs at once, a [TI, D] block (D padded to
a power of two, padded runs empty) of branch-free searches: ceil(log2(max width + 1)) unrolled
steps, each a gather of one score a lane. O(T * D * log W) comparisons a row instead of O(T^2).
Entries of rank < n are scattered with their payloads to output slot `rank`.

Order: that of `select_reference` (the float comparison: -0.0 == +0.0 in either order, -inf ties
-inf; the output score is the stored input, sign bit included). The runs must be non-increasing
under float `>`: unchecked (an unsorted run gives wrong ranks, not an error). NaN scores are not
supported.

Speed (H200): 5.5 us at B = 1024's final shape (14 runs, 14.3k entries, n = 1024, two payloads)
with the defaults TI = 32, 8 warps; other tiles 5.3-7 us (TI 16-64, 4-16 warps), slower with 2
warps or TI = 256 (16-47 us); the floor is likely the chain of ~11 dependent gathers. One stage
(the kernel has no loop to pipeline). The tree build's default from 1000 entries
(`TreeTuning.runs_kernel_from`).

Masked-off scatter lanes: see `kept_width`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["runs_select", "select_reference", "kept_width", "store_kept", "IMPLS"]

IMPLS = ("xla", "pallas", "pallas_interpret")


def select_reference(scores: jax.Array, n: int, *payloads: jax.Array) -> tuple[jax.Array, ...]:
    """XLA path of the selections (runs_select, pair_select): one stable sort by score desc
    (0 - x: -0.0 and +0.0 equal). Returns (scores, positions, *payloads) at the n best, each
    [Bt, n]."""
    p = scores.shape[1]
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), scores.shape)
    order = jax.lax.sort((0.0 - scores, pos), dimension=1, num_keys=2)[1][:, :n]
    take = lambda x: jnp.take_along_axis(x, order, axis=1)  # noqa: E731
    return (take(scores), order, *map(take, payloads))


def kept_width(n: int, interpret: bool) -> int:
    """Output width of a selection of n: n on the GPU, where the masked-off scatter lanes point at
    slot 0 and a masked store writes nothing; n + 1 in interpret mode, which writes masked lanes
    back, so they point at the spare slot n (cut off by the wrapper). A spare slot on the GPU cost
    a copy kernel for the cut, ~4 us with two payloads, nearly as long as runs_select itself."""
    return n + 1 if interpret else n


def store_kept(rank, take, spare: int, *outputs) -> None:
    """In a selection kernel: every lane with `take` stores its value to slot `rank` of each
    output; outputs are (ref, value) pairs of [TI] values."""
    at = jnp.where(take, rank, spare)
    for ref, value in outputs:
        pltriton.store(ref.at[at], value, mask=take)


def _kernel(scores_ref, *refs, widths: tuple[int, ...], n: int, spare: int, ti: int, num_payloads: int):
    payload_refs = refs[:num_payloads]
    out_score, out_pos, *out_payloads = refs[num_payloads:]
    total = sum(widths)
    starts = [sum(widths[:d]) for d in range(len(widths))]
    i = pl.program_id(1) * ti + jnp.arange(ti, dtype=jnp.int32)
    valid = i < total
    at_i = jnp.minimum(i, total - 1)
    v = pltriton.load(scores_ref.at[at_i], mask=valid, other=-jnp.inf)[:, None]

    # Each entry's run and its run's start; each run's start and width as [1, D] vectors
    # (static numbers: no captured constant arrays in the kernel).
    run_i = jnp.zeros_like(i)
    start_i = jnp.zeros_like(i)
    for d, s in enumerate(starts[1:], 1):
        run_i = jnp.where(i >= s, d, run_i)
        start_i = jnp.where(i >= s, s, start_i)
    dp = _pow2_at_least(len(widths))
    d2 = jnp.arange(dp, dtype=jnp.int32)[None, :]
    start_d = jnp.zeros_like(d2)
    width_d = jnp.zeros_like(d2)
    for d, (s, w) in enumerate(zip(starts, widths)):
        start_d = jnp.where(d2 == d, s, start_d)
        width_d = jnp.where(d2 == d, w, width_d)
    earlier = d2 < run_i[:, None]                   # [TI, D]: there an equal score beats

    # count = #{x in run d2 that beat v}: the beating entries are a prefix of the sorted run,
    # whose length is built bit by bit from the highest (a padded run has width 0: count 0).
    count = jnp.zeros((ti, dp), jnp.int32)
    step = _pow2_at_least(max(widths) + 1) // 2
    while step:
        k = count + step
        inside = k <= width_d
        x = pltriton.load(scores_ref.at[jnp.minimum(start_d + k - 1, total - 1)], mask=inside, other=0.0)
        beats = (x > v) | ((x == v) & earlier)
        count = jnp.where(inside & beats, k, count)
        step //= 2
    count = jnp.where(d2 == run_i[:, None], (i - start_i)[:, None], count)
    rank = jnp.sum(count, axis=1)

    store_kept(rank, valid & (rank < n), spare, (out_score, v[:, 0]), (out_pos, i),
               *((dst, pltriton.load(src.at[at_i], mask=valid, other=0)) for src, dst in zip(payload_refs, out_payloads)))


def runs_select(scores: jax.Array, n: int, widths: tuple[int, ...], *payloads: jax.Array,
                impl: str = "pallas", ti: int = 32, num_warps: int = 8) -> tuple[jax.Array, ...]:
    """The n best of each row of scores float32[Bt, T] under (score desc, position asc), best
    first, where the row is len(widths) runs, each sorted best first: (scores [Bt, n],
    positions int32 [Bt, n], *payloads int32 [Bt, P] at them), equal to `select_reference`'s.

    widths: the runs' static widths (each >= 1, sum T). impl: "pallas", its "pallas_interpret"
    twin (any backend, for tests) or "xla" (select_reference: a sort). ti: entries a
    program ranks, a power of two (the grid is Bt x ceil(T / ti)); num_warps: warps a program
    (defaults: the fastest measured at B = 1024's final shape, module doc)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown runs_select impl {impl!r}; choose one of {', '.join(IMPLS)}")
    bt, t = scores.shape
    widths = tuple(int(w) for w in widths)
    if not widths or min(widths) < 1:
        raise ValueError(f"runs_select: widths {widths} must be one or more runs of width >= 1")
    if sum(widths) != t:
        raise ValueError(f"runs_select: widths sum to {sum(widths)}, the rows have T = {t} entries")
    if not 0 < n <= t:
        raise ValueError(f"runs_select: n={n} for rows of {t} entries; give 0 < n <= T")
    if impl == "xla":
        return select_reference(scores, n, *payloads)
    if ti < 1 or ti & (ti - 1):
        raise ValueError(f"runs_select: ti={ti}; give a power of two (a Triton block)")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    interpret = impl == "pallas_interpret"
    width = kept_width(n, interpret)
    row = lambda w: pl.BlockSpec((None, w), lambda b, i: (b, 0))  # noqa: E731
    out_shape = ([jax.ShapeDtypeStruct((bt, width), jnp.float32)]
                 + [jax.ShapeDtypeStruct((bt, width), jnp.int32)] * (1 + len(payloads)))
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    outs = pl.pallas_call(
        functools.partial(_kernel, n=n, spare=width - 1 if interpret else 0, ti=ti, num_payloads=len(payloads),
                          widths=widths),
        grid=(bt, -(-t // ti)),
        in_specs=[row(t)] * (1 + len(payloads)),
        out_specs=[row(width)] * len(out_shape),
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name="runs_select",
    )(scores.astype(jnp.float32), *(x.astype(jnp.int32) for x in payloads))
    return tuple(x[:, :n] for x in outs)
