"""Every depth's beam selection of DDTree's best-first tree in one Pallas kernel (one program a
batch row): the depth loop of ``ddtree_jax.trees.ddtree.best_first_tree`` without a kernel launch
per step.

Why: on the H200 the tree build at B = 64 spends ~8 us of kernels a depth (bench_tree --trace,
session 14: ~6 launches a depth for the candidates, the pairwise rank, the one-hot selection,
the lexicographic rank and the token gather), 14 depths a build, each launch-bound on a few
hundred candidates. Here one program runs all depths: a depth's candidates are gathered through
the static pair table (`_beam_bounds`), ranked by pairwise comparison in [TI, TJ] tiles, and
scattered to their best-first slot; the chosen keys get their lexicographic rank the same way.
Two CTA barriers a depth order the scratch traffic; the loops over depths and tiles stay rolled.

Exactly the XLA path's result: the same float32 sums (previous score + the depth's log-prob),
the same order (score desc, then key asc, keys distinct), the same pair tables and widths. The
work is O(P^2) a depth on one SM (P ~ B ln B candidates), so it is for small budgets only
(``ddtree.BEAM_KERNEL_MAX``).

Layout (per batch row, flattened): vals/toks [D * Kp] (K padded to Kp); the outputs score / lex /
parent / token [L * W + 1] (L the depths the plan reaches, W the widest beam), depth d's beam at
[d * W, d * W + width_d), the last element a spare slot that masked-off scatter lanes point at
(interpret mode writes masked lanes back).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["BeamPlan", "beam_select", "make_plan"]

_BIG_KEY = 1 << 30      # above every real key (lex * k + col < 2**20 for budgets <= 1024)


@dataclasses.dataclass(frozen=True)
class BeamPlan:
    """The static shape of a build: depth 1's width, then per later depth (pair table offset,
    pair count, chosen count). ``rows``/``cols``: the concatenated pair tables
    (each depth's padded with zeros to a multiple of the tile)."""
    width0: int
    depths: tuple[tuple[int, int, int], ...]
    rows: np.ndarray
    cols: np.ndarray
    tile: int

    @property
    def widths(self) -> list[int]:
        return [self.width0] + [n for *_, n in self.depths]


def make_plan(width0: int, per_depth: list[tuple[int, list[tuple[int, int]], int]], tile: int) -> BeamPlan:
    """per_depth: (previous width, pairs, chosen count) for depths 2, 3, ... in order
    (`ddtree._depth_plan`; the previous width is implied by the pairs)."""
    rows, cols, depths, off = [], [], [], 0
    for _, pairs, n_sel in per_depth:
        p = len(pairs)
        padded = -(-p // tile) * tile
        r = np.zeros(padded, np.int32)
        c = np.zeros(padded, np.int32)
        r[:p], c[:p] = zip(*pairs)
        rows.append(r)
        cols.append(c)
        depths.append((off, p, n_sel))
        off += padded
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(tile, np.int32))
    return BeamPlan(width0, tuple(depths), cat(rows), cat(cols), tile)


def _kernel(vals_ref, toks_ref, rows_ref, cols_ref, plan_ref, score_ref, lex_ref, parent_ref, tok_ref,
            ckey_ref, ccol_ref, *, plan: BeamPlan, k: int, kp: int, w: int, interpret: bool):
    spare = score_ref.shape[0] - 1         # the outputs' spare slot
    cspare = ckey_ref.shape[0] - 1         # the scratch's
    tile = plan.tile
    barrier = (lambda: None) if interpret else pltriton.debug_barrier

    def load(ref, idx, mask=None, other=None):
        return pltriton.load(ref.at[idx], mask=mask, other=other)

    def store(ref, idx, x, mask=None):
        pltriton.store(ref.at[idx], x, mask=mask)

    # depth 1: the first width0 ranks in order (best-first and lexicographic orders coincide)
    w0p = _pow2_at_least(plan.width0)
    lane = jnp.arange(w0p, dtype=jnp.int32)
    ok = lane < plan.width0
    at = jnp.where(ok, lane, spare)
    src = jnp.minimum(lane, kp - 1)
    store(score_ref, at, load(vals_ref, src, ok, -jnp.inf), ok)
    store(lex_ref, at, lane, ok)
    store(parent_ref, at, jnp.full_like(lane, -1), ok)
    store(tok_ref, at, load(toks_ref, src, ok, 0), ok)
    barrier()

    # Depths 2, 3, ...: rolled loops (scf.for) over depths and tiles, the depth's pair-table
    # offset, candidate count and chosen count read from plan_ref. (Unrolled, B = 64's 14 depths
    # x 16 tile pairs took minutes for Triton to compile on the H200, session 14.)
    np2 = _pow2_at_least(max(plan.widths[1:], default=1))
    t = jnp.arange(np2, dtype=jnp.int32)

    def depth_step(d, carry):
        off, p, n_sel = plan_ref[d - 1, 0], plan_ref[d - 1, 1], plan_ref[d - 1, 2]
        base_prev, base = (d - 1) * w, d * w
        tiles = (p + tile - 1) // tile

        def candidates(start):
            """(score, key, row, col, valid) of pair-table entries [start, start + tile)."""
            q = start + jnp.arange(tile, dtype=jnp.int32)
            valid = q < p
            rows = load(rows_ref, off + q)
            cols = load(cols_ref, off + q)
            s = load(score_ref, base_prev + rows) + load(vals_ref, d * kp + cols)
            key = load(lex_ref, base_prev + rows) * k + cols
            return (jnp.where(valid, s, -jnp.inf), jnp.where(valid, key, _BIG_KEY + q), rows, cols, valid)

        def i_step(it, carry):
            s_i, key_i, rows_i, cols_i, _ = candidates(it * tile)

            def j_step(jt, rank):
                s_j, key_j, _, _, valid_j = candidates(jt * tile)
                better = valid_j[None, :] & ((s_j[None, :] > s_i[:, None])
                                             | ((s_j[None, :] == s_i[:, None]) & (key_j[None, :] < key_i[:, None])))
                return rank + jnp.sum(jnp.where(better, 1, 0), axis=1)

            rank = jax.lax.fori_loop(0, tiles, j_step, jnp.zeros((tile,), jnp.int32))
            take = rank < n_sel          # invalid entries rank >= p >= n_sel: every valid one beats them
            store(score_ref, jnp.where(take, base + rank, spare), s_i, take)
            store(parent_ref, jnp.where(take, base + rank, spare), rows_i, take)
            store(ckey_ref, jnp.where(take, rank, cspare), key_i, take)
            store(ccol_ref, jnp.where(take, rank, cspare), cols_i, take)
            return carry

        jax.lax.fori_loop(0, tiles, i_step, 0)
        barrier()

        # the chosen keys' lexicographic rank among themselves, and their tokens
        valid_t = t < n_sel
        ck = load(ckey_ref, jnp.minimum(t, cspare), valid_t, _BIG_KEY)
        ck = jnp.where(valid_t, ck, _BIG_KEY + t)
        lex = jnp.sum(jnp.where(ck[None, :] < ck[:, None], 1, 0), axis=1)
        col = load(ccol_ref, jnp.minimum(t, cspare), valid_t, 0)
        at = jnp.where(valid_t, base + t, spare)
        store(lex_ref, at, lex, valid_t)
        store(tok_ref, at, load(toks_ref, d * kp + jnp.clip(col, 0, kp - 1), valid_t, 0), valid_t)
        barrier()
        return carry

    jax.lax.fori_loop(1, len(plan.depths) + 1, depth_step, 0)


def beam_select(vals: jax.Array, toks: jax.Array, plan: BeamPlan, k: int, *, interpret: bool = False,
                num_warps: int = 4) -> tuple[list, list, list, list]:
    """Every depth's beam, as ``best_first_tree``'s loop builds them: lists (one [Bt, width_d]
    array a depth) of scores (float32), lexicographic ranks, parents (index into the previous
    depth's beam, -1 at depth 1) and tokens.

    vals float32 [Bt, D, K] (each depth's top-K log-probs, best first), toks int32 [Bt, D, K];
    plan from :func:`make_plan`; k the ranks a depth has (K). interpret: run the kernel in
    Pallas interpret mode (any backend)."""
    if pltriton is None and not interpret:
        raise RuntimeError("this jax has no Pallas Triton module; use the XLA tree build")
    bt, depth, kk = vals.shape
    kp = _pow2_at_least(kk)
    if kp != kk:
        vals = jnp.pad(vals, ((0, 0), (0, 0), (0, kp - kk)), constant_values=-jnp.inf)
        toks = jnp.pad(toks, ((0, 0), (0, 0), (0, kp - kk)))
    widths = plan.widths
    w = max(widths)
    # per depth 2, 3, ...: (pair-table offset, candidate count, chosen count, 0); one row at least
    table = np.array([(*d, 0) for d in plan.depths] or [(0, 0, 0, 0)], np.int32)
    if max(widths) * k >= _BIG_KEY:
        raise ValueError(f"beam_select: keys lex * k + col reach {max(widths) * k}, above its padding key "
                         f"{_BIG_KEY}; use the XLA depth loop for trees this wide")
    n_depths = len(widths)
    size = n_depths * w + 1
    cap = _pow2_at_least(max(widths[1:], default=1)) + 1
    row = lambda n: pl.BlockSpec((None, n), lambda b: (b, 0))
    whole = pl.BlockSpec((plan.rows.shape[0],), lambda b: (0,))
    out_shape = ([jax.ShapeDtypeStruct((bt, size), jnp.float32)]
                 + [jax.ShapeDtypeStruct((bt, size), jnp.int32)] * 3
                 + [jax.ShapeDtypeStruct((bt, cap), jnp.int32)] * 2)
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    score, lex, parent, tok, _, _ = pl.pallas_call(
        functools.partial(_kernel, plan=plan, k=k, kp=kp, w=w, interpret=interpret),
        grid=(bt,),
        in_specs=[row(depth * kp), row(depth * kp), whole, whole,
                  pl.BlockSpec(table.shape, lambda b: (0, 0))],
        out_specs=[row(size)] * 4 + [row(cap)] * 2,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name="beam_select",
    )(vals.astype(jnp.float32).reshape(bt, depth * kp), toks.astype(jnp.int32).reshape(bt, depth * kp),
      jnp.asarray(plan.rows), jnp.asarray(plan.cols), jnp.asarray(table))
    out = ([], [], [], [])
    for d, wd in enumerate(widths):
        for lst, x in zip(out, (score, lex, parent, tok)):
            lst.append(x[:, d * w:d * w + wd])
    return out
