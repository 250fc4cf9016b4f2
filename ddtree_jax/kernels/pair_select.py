"""A DDTree depth's selection straight from its two sorted lists: the n best sums beam[i] + lp[r]
over a staircase of pairs (i, r), best first, with their parent i and token tok[r]; one Pallas
kernel, many programs a row.

Why: at depth d the candidates are the previous depth's beam (best first) extended by the depth's
ranked tokens (log-probs best first), the pairs (i, r) with r < row_len[i] (`ddtree._beam_bounds`:
non-increasing row lengths, ~B ln B pairs at budget B). A pairwise rank of them costs O(P^2)
comparisons (P = 6238 at B = 1024: 12.5 us a depth on an H200 in one kernel) after XLA has
gathered the sums and the tokens. Both lists are sorted, so every row i' of the staircase holds
the sums in non-increasing order along r', and every column r' along i' (float rounding is
monotone): how many entries of a row (or a column) beat a candidate is a binary search. A program
holds TI candidates; for each it counts
- its own row: r (entries r' < r score >= it and come first; those after never beat it);
- rows i' < A (A = 32 by default): one binary search a row, over r';
- rows i' >= A, which are short (row_len[A] = C entries at most): one pair of binary searches a
  column r' < C, over i' in [A, end[r']).
That is (A + 2C) searches of log2 steps a candidate (~30 x 10 at B = 1024) instead of P
comparisons, the sums computed in the kernel (no [Bt, P] candidate array), and every entry of rank
< n is scattered to its output slot with its parent and token.

Order: (score desc, pair position asc), the pairs listed row by row: `select_reference` on the
candidate array (`pair_select_reference`, tests). A candidate (i, r) is beaten by (i', r') when
the sum of (i', r') is greater, or equal with i' < i, or i' == i and r' < r. NaN is not supported
(the tree build never makes it); -inf and signed zeros are (float `>`: -0.0 == +0.0).
Preconditions: beam and lp non-increasing under `>` (the tree build's beams and ranked log-probs
are), row_len non-increasing.

Speed (H200): with TI = 16, A = 32 and 4 warps (`TreeTuning.pair_kernel_tile`) 7.2 us a depth at
B = 1024, 2.5 us at B = 64; the tree build's default from 100 candidates a depth
(`TreeTuning.pair_kernel_from`).

Masked-off scatter lanes: see `runs_select.kept_width`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from .norms import pltriton
from .runs_select import kept_width, select_reference, store_kept

__all__ = ["pair_select", "pair_select_reference", "IMPLS"]

IMPLS = ("xla", "pallas", "pallas_interpret")


def _pairs(row_len: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(len(row_len), dtype=np.int32), row_len)
    cols = np.concatenate([np.arange(x, dtype=np.int32) for x in row_len] or [np.zeros(0, np.int32)])
    return rows, cols


def pair_select_reference(beam: jax.Array, lp: jax.Array, tok: jax.Array, n: int,
                          row_len: tuple[int, ...]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """XLA path: the candidate sums, then `select_reference` (a stable sort). Returns (scores,
    parents, tokens), each [Bt, n]."""
    rows, cols = _pairs(row_len)
    cand = beam[:, rows] + lp[:, cols]
    score, _, parent, token = select_reference(
        cand, n, jnp.broadcast_to(jnp.asarray(rows), cand.shape), tok[:, cols])
    return score, parent, token


def _kernel(beam_ref, lp_ref, tok_ref, row_ref, col_ref, len_ref, end_ref, out_score, out_parent,
            out_token, *, p: int, n: int, spare: int, ti: int, a: int, c: int, pv: int, k: int,
            row_top: int, col_top: int):
    t = pl.program_id(1)
    q = t * ti + jnp.arange(ti, dtype=jnp.int32)
    valid = q < p
    qc = jnp.minimum(q, p - 1)
    i = row_ref[qc]                                     # [TI] parent (row)
    r = col_ref[qc]                                     # [TI] rank (column)
    v = (beam_ref[i] + lp_ref[r])[:, None]              # [TI, 1] the candidate's sum
    i2 = i[:, None]

    def prefix(length, sum_at, strict, top: int):
        """Per lane, how many of the first `length` entries of its sorted line beat v: the
        beating entries are a prefix, its length built bit by bit from `top` (a power of two
        above every length) down; sum_at(m) is the line's m-th sum."""
        count = jnp.zeros(length.shape, jnp.int32)
        step = top // 2
        while step:
            m = count + step
            x = sum_at(m - 1)
            if isinstance(strict, bool):
                beats = (x > v) if strict else (x >= v)
            else:
                beats = jnp.where(strict, x > v, x >= v)
            count = jnp.where((m <= length) & beats, m, count)
            step //= 2
        return count

    # Own row: the r entries before it. Rows i' < A: by row (>= for rows before i, > after).
    ip = jnp.arange(a, dtype=jnp.int32)[None, :]       # [1, A]
    b_row = beam_ref[jnp.minimum(ip, pv - 1)]           # [1, A]
    along_rows = prefix(len_ref[...][None, :], lambda m: b_row + lp_ref[jnp.clip(m, 0, k - 1)], ip > i2, row_top)
    rank = r + jnp.sum(jnp.where(ip == i2, 0, along_rows), axis=1)

    if c:
        # Columns r' < C over rows [A, end[r']): rows before i count sums >= v, rows after i > v.
        rp = jnp.arange(c, dtype=jnp.int32)[None, :]
        l_col = lp_ref[jnp.minimum(rp, k - 1)]         # [1, C]
        height = end_ref[...][None, :] - a
        col_sum = lambda m: beam_ref[jnp.clip(a + m, 0, pv - 1)] + l_col
        e_ge = a + prefix(height, col_sum, False, col_top)
        e_gt = a + prefix(height, col_sum, True, col_top)
        before = jnp.maximum(jnp.minimum(e_ge, i2) - a, 0)
        after = jnp.maximum(e_gt - jnp.maximum(i2 + 1, a), 0)
        rank = rank + jnp.sum(before + after, axis=1)

    store_kept(rank, valid & (rank < n), spare, (out_score, v[:, 0]), (out_parent, i), (out_token, tok_ref[r]))


def _pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def pair_select(beam: jax.Array, lp: jax.Array, tok: jax.Array, n: int, row_len: tuple[int, ...], *,
                depth: int | None = None, beam_depth: int | None = None, impl: str = "pallas", ti: int = 32,
                a: int = 32, num_warps: int = 4) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The n best sums beam[:, i] + lp[:, r] over the pairs r < row_len[i] (listed row by row),
    best first under (score desc, pair position asc): (scores float32 [Bt, n], parents int32
    [Bt, n] (i), tokens int32 [Bt, n] (tok[:, r])).

    beam float32[Bt, Pv] and lp float32[Bt, K] non-increasing along each row; tok int32[Bt, K];
    row_len: static, non-increasing, len(row_len) <= Pv, every entry <= K. depth: lp and tok
    are [Bt, D, K] and this depth's row is used; beam_depth: beam is [Bt, D, Pv] and that row is
    (so the kernel reads the tree build's arrays in place, not XLA copies of their slices).
    impl: "pallas", its "pallas_interpret" twin (any backend, for tests) or "xla" (the
    reference). ti: candidates a program ranks; a: rows searched along r' (a power of two; the
    rows after it are searched by column); num_warps: warps a program. The tree build passes
    `TreeTuning.pair_kernel_tile`."""
    row_len = tuple(int(x) for x in row_len)
    bt, pv = beam.shape[0], beam.shape[-1]
    k = lp.shape[-1]
    p = sum(row_len)
    if impl not in IMPLS:
        raise ValueError(f"unknown pair_select impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if lp.shape != tok.shape or lp.shape[0] != bt or lp.ndim != (2 if depth is None else 3) \
            or beam.ndim != (2 if beam_depth is None else 3):
        raise ValueError(f"pair_select: lp {lp.shape} and tok {tok.shape} must both be [Bt={bt}, K] "
                         "([Bt, D, K] with depth), beam [Bt, Pv] ([Bt, D, Pv] with beam_depth)")
    if len(row_len) > pv or any(x < 0 or x > k for x in row_len) \
            or any(x < y for x, y in zip(row_len, row_len[1:])):
        raise ValueError(f"pair_select: row_len must be non-increasing, at most {pv} rows (the beam) of "
                         f"at most K={k} entries; got {len(row_len)} rows from {row_len[:1]} to {row_len[-1:]}")
    if not 0 < n <= p:
        raise ValueError(f"pair_select: n={n} for {p} pairs; give 0 < n <= the pair count")
    if a & (a - 1) or ti & (ti - 1):
        raise ValueError(f"pair_select: ti={ti} and a={a} must be powers of two")
    if impl == "xla":
        beam = beam if beam_depth is None else beam[:, beam_depth]
        lp, tok = (lp, tok) if depth is None else (lp[:, depth], tok[:, depth])
        return pair_select_reference(beam, lp, tok, n, row_len)
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    rows, cols = _pairs(row_len)
    padded = row_len + (0,) * max(0, a - len(row_len))
    lens = np.asarray(padded[:a], np.int32)
    tail = padded[a:]
    c = tail[0] if tail else 0
    ends = np.asarray([a + sum(1 for x in tail if x > col) for col in range(c)], np.int32)
    cp = _pow2(c) if c else 0
    ends = np.concatenate([ends, np.full(cp - c, a, np.int32)])    # padded columns: empty
    interpret = impl == "pallas_interpret"
    kernel = functools.partial(
        _kernel, p=p, n=n, spare=n if interpret else 0, ti=ti, a=a, c=cp, pv=pv, k=k,
        row_top=_pow2(int(lens.max()) + 1), col_top=_pow2(int(ends.max()) - a + 1) if cp else 1)
    row = lambda w: pl.BlockSpec((None, w), lambda b, t: (b, 0))

    def row_of(x, d):   # [Bt, w], or row d of [Bt, D, w]
        if d is None:
            return row(x.shape[-1])
        return pl.BlockSpec((None, None, x.shape[-1]), lambda b, t: (b, d, 0))
    table = lambda w: pl.BlockSpec((w,), lambda b, t: (0,))
    width = kept_width(n, interpret)
    out_shape = [jax.ShapeDtypeStruct((bt, width), jnp.float32)] + [jax.ShapeDtypeStruct((bt, width), jnp.int32)] * 2
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    ends_arg = ends if cp else np.zeros(1, np.int32)
    outs = pl.pallas_call(
        kernel,
        grid=(bt, -(-p // ti)),
        in_specs=[row_of(beam, beam_depth), row_of(lp, depth), row_of(tok, depth), table(p), table(p), table(a), table(len(ends_arg))],
        out_specs=[row(width)] * 3,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name="pair_select",
    )(beam.astype(jnp.float32), lp.astype(jnp.float32), tok.astype(jnp.int32), jnp.asarray(rows),
      jnp.asarray(cols), jnp.asarray(lens), jnp.asarray(ends_arg))
    return tuple(x[:, :n] for x in outs)
