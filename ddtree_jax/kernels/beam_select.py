"""Every depth's beam selection of DDTree's best-first tree in one Pallas kernel (one program a
batch row): the depth loop of ``ddtree_jax.trees.ddtree.best_first_tree`` without kernel launches
per depth.

Why: on the H200 XLA's depth loop is ~3 launch-bound kernels a depth (the candidates, the
pairwise rank, the one-hot selection), ~14 depths a build, each on a few hundred candidates.

How, per depth (a rolled loop): every candidate of the depth's pair table is one lane of a
[PP] vector (PP: the widest table, a power of two): its score (the parent's beam score plus the
depth's log-prob), parent and token are gathered once. The scores go to a scratch row; after a
CTA barrier the rank of every candidate is counted against the scratch in [PP, TJ] blocks (a
static loop over column chunks: loads with no dependence on the loop's own work; the counts add
elementwise into one accumulator, reduced once), and each
candidate of rank < n is scattered to its best-first slot of the beam. A second barrier orders
that before the next depth's gathers. Two barriers and one dependent gather a depth; no global
traffic inside the comparison loop but the scratch row.

Exactly the XLA path's result: the same float32 sums, the same order (score desc, then position
in the pair table, which lists candidates by (parent's beam position, rank)), the same pair
tables and widths. The work is O(PP^2) a depth on one SM (P ~ B ln B candidates), so it is for
small budgets only (``ddtree.BEAM_KERNEL_MAX``).

Layout (per batch row, flattened): vals/toks [D * Kp] (K padded to Kp); the outputs score /
parent / token [L * W + 1] (L the depths the plan reaches, W the widest beam), depth d's beam at
[d * W, d * W + width_d), the last element a spare slot that masked-off scatter lanes point at
(interpret mode writes masked lanes back); the scratch row [PP].
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

# Elements of one [PP, TJ] comparison block (TJ = this // PP, at least 8).
BLOCK = 8192


@dataclasses.dataclass(frozen=True)
class BeamPlan:
    """The static shape of a build: depth 1's width, then per later depth (pair count, chosen
    count). ``rows``/``cols``: the depths' pair tables [L - 1, PP], zero beyond each count."""
    width0: int
    depths: tuple[tuple[int, int], ...]
    rows: np.ndarray
    cols: np.ndarray

    @property
    def widths(self) -> list[int]:
        return [self.width0] + [n for _, n in self.depths]

    @property
    def pp(self) -> int:
        return self.rows.shape[1]


def make_plan(width0: int, per_depth: list[tuple[int, list[tuple[int, int]], int]]) -> BeamPlan:
    """per_depth: (previous width, pairs, chosen count) for depths 2, 3, ... in order
    (`ddtree._depth_plan`; the previous width is implied by the pairs)."""
    pp = _pow2_at_least(max((len(pairs) for _, pairs, _ in per_depth), default=1))
    rows = np.zeros((max(1, len(per_depth)), pp), np.int32)
    cols = np.zeros_like(rows)
    for d, (_, pairs, _) in enumerate(per_depth):
        if pairs:
            rows[d, :len(pairs)], cols[d, :len(pairs)] = zip(*pairs)
    depths = tuple((len(pairs), n_sel) for _, pairs, n_sel in per_depth)
    return BeamPlan(width0, depths, rows, cols)


def _kernel(vals_ref, toks_ref, rows_ref, cols_ref, plan_ref, score_ref, parent_ref, tok_ref, cand_ref, *,
            plan: BeamPlan, kp: int, w: int, tj: int, interpret: bool):
    spare = score_ref.shape[0] - 1         # the outputs' spare slot
    pp = plan.pp
    barrier = (lambda: None) if interpret else pltriton.debug_barrier

    def load(ref, idx, mask=None, other=None):
        return pltriton.load(ref.at[idx], mask=mask, other=other)

    def store(ref, idx, x, mask=None):
        pltriton.store(ref.at[idx], x, mask=mask)

    # depth 1: the first width0 ranks in order (best-first)
    w0p = _pow2_at_least(plan.width0)
    lane = jnp.arange(w0p, dtype=jnp.int32)
    ok = lane < plan.width0
    at = jnp.where(ok, lane, spare)
    src = jnp.minimum(lane, kp - 1)
    store(score_ref, at, load(vals_ref, src, ok, -jnp.inf), ok)
    store(parent_ref, at, jnp.full_like(lane, -1), ok)
    store(tok_ref, at, load(toks_ref, src, ok, 0), ok)
    barrier()

    q = jnp.arange(pp, dtype=jnp.int32)

    def depth_step(d, carry):
        p, n_sel = plan_ref[d - 1, 0], plan_ref[d - 1, 1]
        valid = q < p
        rows = load(rows_ref, (d - 1) * pp + q)
        cols = load(cols_ref, (d - 1) * pp + q)
        s = load(score_ref, (d - 1) * w + rows) + load(vals_ref, d * kp + cols)
        s = jnp.where(valid, s, -jnp.inf)   # padding: -inf at positions past p, beaten by every valid one
        tok = load(toks_ref, d * kp + cols)
        store(cand_ref, q, s)
        barrier()
        # elementwise counts into a [PP, TJ] accumulator, one reduction at the end (a reduction a
        # chunk made ddtree_jax.kernels.rank_select 3x slower, session 17)
        acc = jnp.zeros((pp, tj), jnp.int32)
        for j0 in range(0, pp, tj):
            jj = j0 + jnp.arange(tj, dtype=jnp.int32)
            sj = load(cand_ref, jj)
            better = (sj[None, :] > s[:, None]) | ((sj[None, :] == s[:, None]) & (jj[None, :] < q[:, None]))
            acc = acc + jnp.where(better, 1, 0)
        rank = jnp.sum(acc, axis=1)
        take = rank < n_sel
        at = jnp.where(take, d * w + rank, spare)
        store(score_ref, at, s, take)
        store(parent_ref, at, rows, take)
        store(tok_ref, at, tok, take)
        barrier()
        return carry

    jax.lax.fori_loop(1, len(plan.depths) + 1, depth_step, 0)


def beam_select(vals: jax.Array, toks: jax.Array, plan: BeamPlan, *, interpret: bool = False,
                num_warps: int = 8) -> tuple[list, list, list]:
    """Every depth's beam, as ``best_first_tree``'s loop builds them: lists (one [Bt, width_d]
    array a depth) of scores (float32), parents (index into the previous depth's beam, -1 at
    depth 1) and tokens.

    vals float32 [Bt, D, K] (each depth's top-K log-probs, best first), toks int32 [Bt, D, K];
    plan from :func:`make_plan`. interpret: run the kernel in Pallas interpret mode (any
    backend)."""
    if pltriton is None and not interpret:
        raise RuntimeError("this jax has no Pallas Triton module; use the XLA tree build")
    bt, depth, kk = vals.shape
    kp = _pow2_at_least(kk)
    if kp != kk:
        vals = jnp.pad(vals, ((0, 0), (0, 0), (0, kp - kk)), constant_values=-jnp.inf)
        toks = jnp.pad(toks, ((0, 0), (0, 0), (0, kp - kk)))
    widths = plan.widths
    w = max(widths)
    pp = plan.pp
    tj = min(pp, max(8, BLOCK // pp))
    # per depth 2, 3, ...: (candidate count, chosen count, 0, 0); one row at least
    table = np.array([(*d, 0, 0) for d in plan.depths] or [(0, 0, 0, 0)], np.int32)
    size = len(widths) * w + 1
    row = lambda n: pl.BlockSpec((None, n), lambda b: (b, 0))
    whole = lambda x: pl.BlockSpec(x.shape, lambda b: (0,) * x.ndim)
    rows, cols = plan.rows.reshape(-1), plan.cols.reshape(-1)
    out_shape = ([jax.ShapeDtypeStruct((bt, size), jnp.float32)]
                 + [jax.ShapeDtypeStruct((bt, size), jnp.int32)] * 2
                 + [jax.ShapeDtypeStruct((bt, pp), jnp.float32)])
    params = None if interpret else pltriton.CompilerParams(num_warps=num_warps, num_stages=1)
    score, parent, tok, _ = pl.pallas_call(
        functools.partial(_kernel, plan=plan, kp=kp, w=w, tj=tj, interpret=interpret),
        grid=(bt,),
        in_specs=[row(depth * kp), row(depth * kp), whole(rows), whole(cols), whole(table)],
        out_specs=[row(size)] * 3 + [row(pp)],
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name="beam_select",
    )(vals.astype(jnp.float32).reshape(bt, depth * kp), toks.astype(jnp.int32).reshape(bt, depth * kp),
      jnp.asarray(rows), jnp.asarray(cols), jnp.asarray(table))
    out = ([], [], [])
    for d, wd in enumerate(widths):
        for lst, x in zip(out, (score, parent, tok)):
            lst.append(x[:, d * w:d * w + wd])
    return out
