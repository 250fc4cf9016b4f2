"""The n best entries of each row, best first, under (score desc, position asc), with int32
payloads carried along: one Pallas kernel, many programs a row.

Why: the tree build's selections at large budgets (a depth's ~6.2k candidates at B = 1024, the
final ~14.3k entries over all depths) ran as XLA's pairwise compare-and-sum reduction (14-23 us a
depth on the H200, session 16), then a scatter inverting the ranks and gathers of every kept
value: ~5 kernels a selection. Here one kernel does it: program (row, tile) holds TI entries,
counts for each how many of the row's P entries beat it, and scatters every entry of rank < n
with its payloads to output slot `rank`. The row is read in TJ-wide chunks (rolled loops) whose
[TI, TJ] comparisons add elementwise into an accumulator, reduced once at the end (a reduction a
chunk was 3x slower, s17c); chunks wholly before the tile count an equal score as beating, those
wholly after do not, and only the overlapping ones compare positions.
O(P^2) comparisons a row as before, spread over P / TI programs; no [P, P] intermediate, no
inverse permutation, no gathers after.

Order: score desc (the float comparison: -0.0 == +0.0, -inf ties -inf), then position asc:
`ddtree.select_best` with positions as keys (tests). NaN scores are not supported (the tree
build never makes them).

Status (H200, session 17, bench/RESULTS.md): the GPU default from 1000 entries
(`ddtree.RANK_KERNEL_FROM`) with TI = 32, TJ = 256 and 8 warps: 12.7 us a depth at B = 1024
against XLA's 16-19.5 us, the whole build 0.486 -> 0.374 ms.

Masked-off scatter lanes: see `kept_width` (a spare slot in interpret mode only).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .norms import pltriton

__all__ = ["rank_select", "rank_select_reference", "kept_width", "store_kept", "IMPLS"]

IMPLS = ("xla", "pallas", "pallas_interpret")


def rank_select_reference(scores: jax.Array, n: int, *payloads: jax.Array) -> tuple[jax.Array, ...]:
    """XLA path: one stable sort by score desc (0 - x: -0.0 and +0.0 equal). Returns (scores,
    positions, *payloads) at the n best, each [Bt, n]."""
    p = scores.shape[1]
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), scores.shape)
    order = jax.lax.sort((0.0 - scores, pos), dimension=1, num_keys=2)[1][:, :n]
    take = lambda x: jnp.take_along_axis(x, order, axis=1)
    return (take(scores), order, *map(take, payloads))


def kept_width(n: int, interpret: bool) -> int:
    """Output width of a selection of n: n on the GPU, where the masked-off scatter lanes point at
    slot 0 and a masked store writes nothing; n + 1 in interpret mode, which writes masked lanes
    back, so they point at the spare slot n (cut off by the wrapper). A spare slot on the GPU cost
    a copy kernel for the cut, ~4 us (session 18)."""
    return n + 1 if interpret else n


def store_kept(rank, take, spare: int, *outputs) -> None:
    """In a selection kernel: every lane with `take` stores its value to slot `rank` of each
    output; outputs are (ref, value) pairs of [TI] values."""
    at = jnp.where(take, rank, spare)
    for ref, value in outputs:
        pltriton.store(ref.at[at], value, mask=take)


def _kernel(scores_ref, *refs, p: int, n: int, spare: int, ti: int, tj: int, num_payloads: int):
    payload_refs = refs[:num_payloads]
    out_score, out_pos, *out_payloads = refs[num_payloads:]
    t = pl.program_id(1)
    i = t * ti + jnp.arange(ti, dtype=jnp.int32)
    valid = i < p
    at_i = jnp.minimum(i, p - 1)
    s_i = pltriton.load(scores_ref.at[at_i], mask=valid, other=-jnp.inf)[:, None]

    def chunk(rule):
        def body(c, acc):
            j = c * tj + jnp.arange(tj, dtype=jnp.int32)
            s_j = pltriton.load(scores_ref.at[jnp.minimum(j, p - 1)], mask=j < p, other=-jnp.inf)[None, :]
            if rule == "before":        # every j < every i: an equal score beats
                better = s_j >= s_i
            elif rule == "after":       # every j > every i (past p: -inf, which beats nothing)
                better = s_j > s_i
            else:
                better = (s_j > s_i) | ((s_j == s_i) & (j[None, :] < i[:, None]))
            return acc + jnp.where(better, 1, 0)
        return body

    # Chunks wholly before the tile, those that overlap it, those wholly after: elementwise
    # counts in a [TI, TJ] accumulator, one reduction at the end.
    first_overlap = (t * ti) // tj
    after = ((t + 1) * ti + tj - 1) // tj
    acc = jnp.zeros((ti, tj), jnp.int32)
    acc = jax.lax.fori_loop(0, first_overlap, chunk("before"), acc)
    acc = jax.lax.fori_loop(first_overlap, after, chunk("overlap"), acc)
    acc = jax.lax.fori_loop(after, -(-p // tj), chunk("after"), acc)
    rank = jnp.sum(acc, axis=1)
    store_kept(rank, valid & (rank < n), spare, (out_score, s_i[:, 0]), (out_pos, i),
               *((dst, pltriton.load(src.at[at_i], mask=valid, other=0)) for src, dst in zip(payload_refs, out_payloads)))


def rank_select(scores: jax.Array, n: int, *payloads: jax.Array, impl: str = "pallas", ti: int = 32,
                tj: int = 128, num_warps: int = 4) -> tuple[jax.Array, ...]:
    """The n best of each row of scores float32[Bt, P] under (score desc, position asc), best
    first: (scores [Bt, n], positions int32 [Bt, n], *payloads int32 [Bt, P] at them).

    impl: "pallas", its "pallas_interpret" twin (any backend, for tests) or "xla" (the
    reference). ti: entries a program ranks (the grid is Bt x ceil(P / ti)); tj: entries a
    step of its loop compares them with; num_warps: warps a program."""
    if impl == "xla":
        return rank_select_reference(scores, n, *payloads)
    if impl not in IMPLS:
        raise ValueError(f"unknown rank_select impl {impl!r}; choose one of {', '.join(IMPLS)}")
    bt, p = scores.shape
    if not 0 < n <= p:
        raise ValueError(f"rank_select: n={n} for rows of {p} entries; give 0 < n <= P")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    return select_call(_kernel, scores, payloads, n, ti=ti, num_warps=num_warps, num_stages=2,
                       interpret=impl == "pallas_interpret", name="rank_select", p=p, tj=tj)


def select_call(kernel, scores: jax.Array, payloads, n: int, *, ti: int, num_warps: int, num_stages: int,
                interpret: bool, name: str, **static) -> tuple[jax.Array, ...]:
    """The pallas_call the ranking selections share (rank_select, runs_select): a
    Bt x ceil(T / ti) grid whose programs see whole rows of scores float32[Bt, T] and the int32
    payloads, and write the kept width (kept_width) of scores, positions and payloads; the outputs
    cut to n. kernel(refs..., n=, spare=, ti=, num_payloads=, **static)."""
    bt, t = scores.shape
    width = kept_width(n, interpret)
    row = lambda w: pl.BlockSpec((None, w), lambda b, i: (b, 0))  # noqa: E731
    out_shape = ([jax.ShapeDtypeStruct((bt, width), jnp.float32)]
                 + [jax.ShapeDtypeStruct((bt, width), jnp.int32)] * (1 + len(payloads)))
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)
    outs = pl.pallas_call(
        functools.partial(kernel, n=n, spare=width - 1 if interpret else 0, ti=ti, num_payloads=len(payloads),
                          **static),
        grid=(bt, -(-t // ti)),
        in_specs=[row(t)] * (1 + len(payloads)),
        out_specs=[row(width)] * len(out_shape),
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name=name,
    )(scores.astype(jnp.float32), *(x.astype(jnp.int32) for x in payloads))
    return tuple(x[:, :n] for x in outs)
