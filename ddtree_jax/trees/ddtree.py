"""DDTree's best-first tree (Ringel & Romano 2026): the `budget` most likely rank paths.

A node is a path of ranks `(r1..rd)`; rank `r` at depth `d` is the r-th token of
`top_k(logp[:, d-1])`. Its score is `logp[0, tok(r1)] + ... + logp[d-1, tok(rd)]`, summed in
float32 from depth 1 down. The tree is the `budget` best nodes under the total order

    higher score first; equal scores: lower depth first; then the node whose parent comes
    first in this order; then the lower last rank.

That is the order of a handful of top-k selections: each depth's beam is the top of its
candidates listed by (parent's beam position, rank), ties going to the lower position, and the
final top over all depths lists them by depth. Every parent and every lower-ranked sibling
precedes a node in this order (log-probs are <= 0 and float rounding is monotone), so the chosen
set is prefix-closed, and it is exactly what the classic heap algorithm (pop the best path, push
its next sibling and its first child, the heap keyed by (-score, depth, the parent's pop index,
rank)) pops first. Without a heap: beam search of width `W = budget` keeps, per depth, the W best
extensions of the previous depth's beam (the best W of the W x K candidates, K = min(W, V),
pruned to ~W ln W - W, and to W - d + 1 kept at depth d: `_beam_bounds`); a global
best-`budget` over all beams picks the tree. Every selection orders by (score desc, position
asc), a candidate's position encoding (depth, parent's beam position, rank), so no key beyond
the position is kept.

Slots come out in that same best-first order (slot 1 = best path), which is topological.

How each step runs (XLA's ops or a Pallas kernel, a sort or a pairwise count, ...) is the
policy's `TreeTuning` (`ddtree_jax.tuning`): every way builds the same tree (tests).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.kernels.chunk_topk import chunk_top_k, from_order_key, index_ordered, order_key, top_k_total_order
from ddtree_jax.kernels.pair_select import pair_select
from ddtree_jax.kernels.runs_select import runs_select
from ddtree_jax.kernels.select_top import MAX_WIDTH as SELECT_TOP_MAX_WIDTH
from ddtree_jax.kernels.select_top import select_top
from ddtree_jax.trees.base import (DEFAULT_TUNING, Array, DraftTree, TreePolicy, check_budget, check_logp,
                                   register_policy, tree_from_nodes)
from ddtree_jax.tuning import TreeTuning


def _impl(tuning: TreeTuning, name: str = "pallas") -> str:
    """A kernel's impl as `tuning.kernels` runs it: `name` compiled, or its "_interpret" twin."""
    return name if tuning.kernels == "pallas" else f"{name}_interpret"


def _materialized(tuning: TreeTuning, *xs):
    """xs behind an optimization barrier where `tuning.select_barrier`: unmaterialized, XLA fuses
    every depth's gather chain into that depth's pairwise comparison and writes the [P, P]
    comparison out before summing it."""
    return jax.lax.optimization_barrier(xs) if tuning.select_barrier else xs


def _onehot_applies(n: int, p: int, tuning: TreeTuning) -> bool:
    return p <= tuning.rank_by_count_max and n * p <= tuning.select_onehot_max


def select_onehot(scores: Array, keys: Array, n: int, *extra: Array) -> tuple[Array, ...]:
    """(scores, keys, *extra) at the n best entries, best first, under (score desc, key asc):
    the values that gathering at select_best's positions gives, picked by one-hot reductions
    over the ranks (for output slot t: max over p of where(rank[p] == t, x[p], fill)) instead of
    a scatter and gathers. scores: float32 or int32[Bt, P]; extra: int32[Bt, P] arrays carried
    along. O(n P) work."""
    rank = _rank(scores, keys)
    hit = rank[:, None, :] == jnp.arange(n, dtype=jnp.int32)[:, None]  # [Bt, n, P]
    low = jnp.iinfo(jnp.int32).min
    lowest = -jnp.inf if jnp.issubdtype(scores.dtype, jnp.floating) else low
    return ((jnp.max(jnp.where(hit, scores[:, None, :], lowest), axis=-1),)
            + tuple(jnp.max(jnp.where(hit, x[:, None, :], low), axis=-1) for x in (keys, *extra)))


def _rank(scores: Array, keys: Array) -> Array:
    """Position of every entry under (score desc, key asc) by pairwise count: int32[Bt, P]."""
    si, sj = scores[:, :, None], scores[:, None, :]
    better = (sj > si) | ((sj == si) & (keys[:, None, :] < keys[:, :, None]))
    return better.sum(-1, dtype=jnp.int32)  # a permutation of 0..P-1 (keys are distinct)


def _pair_kernel(p: int, tuning: TreeTuning) -> dict | None:
    """pair_select's keyword arguments for a depth of p candidates, or None (XLA's selection)."""
    if not tuning.pair_kernel_from or p < tuning.pair_kernel_from:
        return None
    ti, a, warps = tuning.pair_kernel_tile
    return dict(impl=_impl(tuning), ti=ti, a=a, num_warps=warps)


def _runs_kernel(t: int, tuning: TreeTuning) -> dict | None:
    """runs_select's keyword arguments for a final selection over t entries, or None."""
    if not tuning.runs_kernel_from or t < tuning.runs_kernel_from:
        return None
    return dict(impl=_impl(tuning))


def _row_lengths(pairs: list[tuple[int, int]]) -> tuple[int, ...]:
    """Per beam row i, how many ranks r its candidates (i, 0..r-1) take (`_beam_bounds` lists
    them row by row, ranks from 0, row lengths non-increasing)."""
    rows = np.asarray([i for i, _ in pairs])
    return tuple(np.bincount(rows).tolist())


def select_best(scores: Array, keys: Array | None, n: int, tuning: TreeTuning = DEFAULT_TUNING) -> Array:
    """Positions of the n best entries, best first, under (score desc, key asc); keys distinct.

    scores float32[Bt, P], keys int32[Bt, P] or None (each entry's own position). Returns
    int32[Bt, n] indices into P. Up to `tuning.rank_by_count_max` entries by pairwise count (one
    fused O(P^2) reduction), else by a two-key sort, or, for position keys compiled for the CPU,
    by lax.top_k (`_top_by_position`): the same order.
    """
    p = scores.shape[1]
    idx = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), scores.shape)
    if p <= tuning.rank_by_count_max:
        return _invert(_rank(scores, idx if keys is None else keys), n)

    def by_sort(scores):  # 0 - x: descending by score, -0.0 and +0.0 equal as in the ranked branch
        return jax.lax.sort((0.0 - scores, idx if keys is None else keys, idx), dimension=1, num_keys=2)[2][:, :n]

    if keys is None and scores.dtype == jnp.float32:
        return jax.lax.platform_dependent(scores, cpu=lambda s: _top_by_position(s, n), default=by_sort)
    return by_sort(scores)


def _top_by_position(scores: Array, n: int) -> Array:
    """select_best's order for position keys by lax.top_k (equal values by lower index), -0.0
    made +0.0 first: on the CPU ~10x faster than the sort (DDTree-256's selections were most of
    a replay there)."""
    return top_k_total_order(jnp.where(scores == 0, jnp.float32(0), scores), n)[1]


def _vocab_top_k_settings(k: int, tuning: TreeTuning) -> tuple[int | None, int | None, str]:
    """(chunks, keep, stage1) of `vocab_top_k` for K = k under `tuning.vocab_topk`."""
    cfg = tuning.vocab_topk
    if cfg is None:
        return None, None, "xla"
    return cfg.chunks, cfg.keep if k >= cfg.keep_from_k else None, _impl(tuning, "threshold")


def _stage2(k: int, tuning: TreeTuning) -> str:
    """The second stage of `vocab_top_k` for K = k: the threshold kernel where `stage2_max_k`
    covers K and every chunk keeps all K; else select_top where `stage2_select` is on and the
    candidates fit `_second_stage_by_select`; else "xla" (lax.top_k)."""
    cfg = tuning.vocab_topk
    if cfg is None:
        return "xla"
    chunks, keep, _ = _vocab_top_k_settings(k, tuning)
    if keep is None and k <= cfg.stage2_max_k:
        return _impl(tuning, "threshold")
    n = chunks * min(keep or k, k)
    c = _select_chunking(n, k)
    if cfg.stage2_select and k < n and (c * k if c > 1 else n) <= SELECT_TOP_MAX_WIDTH:
        return _impl(tuning, "select")
    return "xla"


def _stage1_options(tuning: TreeTuning) -> dict:
    """The threshold kernel's launch options (`VocabTopK.num_warps`, `radix_bits`)."""
    cfg = tuning.vocab_topk
    return {} if cfg is None else dict(num_warps=cfg.num_warps, radix_bits=cfg.radix_bits)


def tuned_vocab_top_k(logp: Array, k: int, tuning: TreeTuning = DEFAULT_TUNING) -> tuple[Array, Array]:
    """`vocab_top_k(logp, k)` in the stages `tuning.vocab_topk` sets (one lax.top_k where None)."""
    chunks, keep, stage1 = _vocab_top_k_settings(k, tuning)
    return vocab_top_k(logp, k, chunks, keep, stage1, _stage2(k, tuning), **_stage1_options(tuning))


def vocab_top_k(logp: Array, k: int, chunks: int | None = None, keep: int | None = None, stage1: str = "xla",
                stage2: str = "xla", **stage1_options) -> tuple[Array, Array]:
    """`lax.top_k(logp, k)` over the last axis in the float total order (`top_k_total_order`:
    -0.0 below +0.0 on every backend), optionally in two stages: the top `keep` (default
    k) of each of `chunks` contiguous slices, then the top k of those candidates. Same values,
    indices and tie rule (lower index first): candidates stay in index order by chunk, and each
    chunk's by rank.

    With keep < k a chunk may hold more than `keep` of the top k. The result is exact anyway:
    if some chunk's last kept value is not strictly below the k-th candidate value (so a dropped
    token could tie or beat it), the whole row set falls back to one `lax.top_k` (`lax.cond`).
    Otherwise every dropped value is below the k-th candidate, which is then the true k-th value.

    stage1: how the per-chunk top `keep` runs (`ddtree_jax.kernels.chunk_topk.chunk_top_k`'s impl:
    "xla", the reference, or the threshold kernel, "threshold" / "threshold_interpret"). Both keep
    the same candidates; "threshold" lists each chunk's by token index instead of by rank, which
    the second stage's sort makes no difference to (chunk-major index order is token order, so
    its lower-position-first tie rule still picks the lower token). stage1_options go to
    chunk_top_k (num_warps, radix_bits; the XLA stage ignores them).

    stage2: "xla" (one `lax.top_k` over the candidates, a sort on GPUs), a threshold impl
    ("threshold" / "threshold_interpret": `_second_stage_by_threshold`), only where every chunk
    keeps all k (no exactness check needed), or a select impl ("select" / "select_interpret":
    `_second_stage_by_select`, any k).
    """
    v = logp.shape[-1]
    length = -(-v // chunks) if chunks else v
    keep = min(k if keep is None else max(1, keep), k, length)
    if not chunks or chunks < 2 or keep * chunks < k:
        return top_k_total_order(logp, k)
    vals, idx = chunk_top_k(logp, chunks, keep, impl=stage1, **stage1_options)  # [..., C, keep]
    # [..., C]: the smallest kept value of each chunk (the last, where they are by rank)
    last = vals.min(axis=-1) if index_ordered(stage1) else vals[..., -1]
    vals = vals.reshape(*logp.shape[:-1], chunks * keep)
    idx = idx.reshape(*logp.shape[:-1], chunks * keep)
    if keep == k and stage2.startswith("threshold"):
        return _second_stage_by_threshold(vals, idx, k, stage2, **stage1_options)
    if stage2.startswith("select"):
        out = _second_stage_by_select(vals, idx, k, stage2.endswith("_interpret"), **stage1_options)
    else:
        top, pos = top_k_total_order(vals, k)
        out = top, jnp.take_along_axis(idx, pos, axis=-1)
    if keep == k:
        return out
    top = out[0]
    exact = jnp.all(last < top[..., -1:])
    return jax.lax.cond(exact, lambda: out, lambda: top_k_total_order(logp, k))


# Candidates a program of the threshold second stage holds (`_second_stage_by_threshold`).
STAGE2_CHUNK = 1024


def _second_stage_by_threshold(vals: Array, idx: Array, k: int, impl: str, **options) -> tuple[Array, Array]:
    """The top k of the first stage's candidates (vals [..., n] with token indices idx), as
    `lax.top_k` orders them on the CPU and by sort (value desc in the float total order, -0.0
    below +0.0; equal values by lower token first; XLA's GPU TopK kernel, which lax.top_k runs
    at K <= 16, ranks -0.0 and +0.0 as equal instead), without a sort: the threshold kernel keeps
    the k best of every STAGE2_CHUNK candidates (its ties by lower position, which is token order among equal
    values: chunk-major candidates, each chunk's listed by token or, for equal values, by lower
    token first), then `select_onehot` orders the c * k survivors by (total-order key desc,
    token asc) and picks the k best. O((c k)^2) a row: for small k only (`VocabTopK.stage2_max_k`)."""
    lead, n = vals.shape[:-1], vals.shape[-1]
    c = max(1, n // STAGE2_CHUNK)
    v, pos = chunk_top_k(vals, c, k, impl=impl, **options)        # [..., c, k]
    tok = jnp.take_along_axis(idx, pos.reshape(*lead, c * k), axis=-1)
    top_key, top_tok = select_onehot(order_key(v).reshape(-1, c * k), tok.reshape(-1, c * k), k)
    return from_order_key(top_key).astype(vals.dtype).reshape(*lead, k), top_tok.reshape(*lead, k)


def _select_chunking(n: int, k: int) -> int:
    """Chunks of the threshold kernel in front of `_second_stage_by_select` for n candidates
    (1: none): STAGE2_CHUNK-candidate chunks where each keeps at most half of its candidates."""
    return n // STAGE2_CHUNK if n > SELECT_TOP_MAX_WIDTH or (n >= 2 * STAGE2_CHUNK and 2 * k <= STAGE2_CHUNK) else 1


def _second_stage_by_select(vals: Array, idx: Array, k: int, interpret: bool, **options) -> tuple[Array, Array]:
    """The top k of the first stage's candidates (vals [..., n] with token indices idx) in
    `lax.top_k`'s order, as `_second_stage_by_threshold` but for any k: the threshold kernel
    first keeps the k best of every STAGE2_CHUNK candidates where that halves them at least
    (`_select_chunking`), then `select_top` keeps the k best of the rest (ties by lower position:
    token order among equal values, see `_second_stage_by_threshold`), and a pairwise rank of
    those k (total-order key desc, position asc) orders them: O(k^2) a row instead of a sort.
    options go to the threshold kernel."""
    lead, n = vals.shape[:-1], vals.shape[-1]
    c = _select_chunking(n, k)
    v, tok = vals.reshape(-1, n), idx.reshape(-1, n)
    if c > 1:
        v, pos = chunk_top_k(v, c, k, impl="threshold_interpret" if interpret else "threshold", **options)
        v, tok = v.reshape(-1, c * k), jnp.take_along_axis(tok, pos.reshape(-1, c * k), axis=-1)
    pos = select_top(v, k, impl="pallas_interpret" if interpret else "pallas")
    v, tok = jnp.take_along_axis(v, pos, axis=-1), jnp.take_along_axis(tok, pos, axis=-1)
    order = _invert(_rank(order_key(v), pos), k)
    v, tok = jnp.take_along_axis(v, order, axis=-1), jnp.take_along_axis(tok, order, axis=-1)
    return v.reshape(*lead, k), tok.reshape(*lead, k)


def _invert(perm: Array, size: int) -> Array:
    """out[b, perm[b, i]] = i: the inverse of permutations int32[Bt, P], cut to `size` columns."""
    batch, p = perm.shape
    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], perm.shape)
    idx = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), perm.shape)
    return jnp.zeros((batch, size), jnp.int32).at[rows, perm].set(idx, mode="drop")


def _beam_bounds(prev: int, k: int, width: int, n: int | None, d: int) -> tuple[int, list[tuple[int, int]]]:
    """(beam width, candidate (i, r) pairs) at depth d >= 2 from a beam of `prev` entries: the
    extension of the previous beam's i-th best entry by its r-th ranked token.

    Every bound counts nodes that beat a candidate in DDTree's order (score, then depth, then
    the parent's position, then rank; log-probs are <= 0 and float rounding is monotone). The
    pairs come out in that key order (i, then r):
    - (j, s) for j <= i, s <= r beat (i, r): (i+1)(r+1) - 1 nodes of depth d. So only
      (i+1)(r+1) <= width can make the depth's best `width` (~width ln width candidates
      instead of width * K).
    - n given (the exact tree, width >= n: a node matters only if it is among the n best
      overall): the previous beam's entries 0..i (i + 1 nodes of depth d - 1) and the d - 2
      ancestors of entry i beat (i, r) too, so it needs (i+1)(r+1) - 1 + (i+1) + (d-2) < n,
      i.e. (i+1)(r+2) <= n - d + 2; and a node of depth d among the n best is beaten by fewer
      than n - (d - 1) nodes of depth d, so the beam keeps n - d + 1. That is ~n fewer
      candidates a depth (at depth 2: 34 / 216 / 1210 / 6238 instead of 50 / 280 / 1466 / 7262
      at B = 16 / 64 / 256 / 1024, so ~25-50 % fewer pairwise comparisons) and none past
      depth n.
    Exact whenever float32 sums do not round two different beam scores into a tie (the same
    caveat as the first bound's).
    """
    if n is None:
        return width, [(i, r) for i in range(prev) for r in range(min(k, width // (i + 1)))]
    room = n - d + 2
    pairs = [(i, r) for i in range(prev) for r in range(min(k, room // (i + 1) - 1))]
    return max(0, n - d + 1), pairs


def _depth_plan(w: int, k: int, width: int, n: int | None, depth: int) -> list[tuple[int, list, int]]:
    """The static shape of the depth loop: per depth 2, 3, ... (previous beam width, candidate
    (i, r) pairs, chosen count), stopping where no pair is left (`_beam_bounds`)."""
    plan, prev = [], w
    for d in range(1, depth):
        beam, pairs = _beam_bounds(prev, k, width, n, d + 1)
        if not pairs:  # no node this deep can be among the n best (nor deeper ones)
            break
        plan.append((prev, pairs, min(beam, len(pairs))))
        prev = plan[-1][2]
    return plan


def _beams(vals: Array, toks: Array, w: int, plan: list, tuning: TreeTuning) -> tuple[list, list, list]:
    """Every depth's beam (scores, parents, tokens; one [Bt, width] array a depth): a selection a
    depth, in pair_select or by XLA's ops (`select_best` or `select_onehot`). A candidate's key is
    its position in the depth's pair list, which `_beam_bounds` lists by (parent's beam position,
    rank): static."""
    batch = vals.shape[0]
    score = vals[:, 0, :w]
    scores, parents, tokens = [score], [jnp.full((batch, w), -1, jnp.int32)], [toks[:, 0, :w]]
    for d, (_, pairs, n_sel) in enumerate(plan, start=1):
        pair_kernel = _pair_kernel(len(pairs), tuning)
        rows, cols = (np.asarray(x, np.int32) for x in zip(*pairs))
        if pair_kernel:
            # The arrays in place (the depth as an index, depth 1's beam as row 0 of vals): no
            # XLA copies of their slices in front of the kernel.
            beam, beam_depth = (vals, 0) if d == 1 else (score, None)
            score, parent, token = pair_select(beam, vals, toks, n_sel, _row_lengths(pairs), depth=d,
                                               beam_depth=beam_depth, **pair_kernel)
        else:
            (cand,) = _materialized(tuning, score[:, rows] + vals[:, d, cols])
            key = jnp.broadcast_to(jnp.arange(len(pairs), dtype=jnp.int32), cand.shape)
            if _onehot_applies(n_sel, len(pairs), tuning):
                # one fusion in place of the inverse permutation's scatter and the gathers
                rows_b, cols_b = (jnp.broadcast_to(jnp.asarray(x), cand.shape) for x in (rows, cols))
                score, _, parent, col = select_onehot(cand, key, n_sel, rows_b, cols_b)
                (score,) = _materialized(tuning, score)
            else:
                sel = select_best(cand, None, n_sel, tuning)
                (score,) = _materialized(tuning, jnp.take_along_axis(cand, sel, axis=-1))
                parent, col = jnp.asarray(rows)[sel], jnp.asarray(cols)[sel]
            token = jnp.take_along_axis(toks[:, d], col, axis=-1)
        scores.append(score)
        parents.append(parent)
        tokens.append(token)
    return scores, parents, tokens


def best_first_tree(logp: Array, budget: int, width: int, num_slots: int,
                    tuning: TreeTuning = DEFAULT_TUNING) -> DraftTree:
    """The `budget` best nodes among those reached by a beam of `width` per depth.

    `width >= budget` gives DDTree's exact best-first tree. Slots beyond the number of distinct
    beam nodes (tiny vocabularies) are padded invalid up to `num_slots` nodes.

    Each depth's beam is kept in best-first order (score desc, position asc), so a depth costs
    one selection and the next depth's candidates are listed in key order. `tuning` picks how
    every step runs; the tree is the same.
    """
    logp = check_logp(logp)
    batch, depth, vocab = logp.shape
    n = min(budget, num_slots)
    if n == 0 or depth == 0 or vocab == 0 or width == 0:
        empty = jnp.zeros((batch, 0), jnp.int32)
        return tree_from_nodes(empty, empty, empty, num_slots, depth, tuning=tuning)
    k = min(width, vocab)
    vals, toks = tuned_vocab_top_k(logp, k, tuning)  # [Bt, D, K]: rank r -> (log-prob, token)
    # Without the barrier XLA:CPU fuses the vocabulary-wide top-k into each consumer and runs it
    # again per depth: 30 ms instead of 0.5 ms for B=16, D=15, V=8192 (measured here).
    vals, toks = jax.lax.optimization_barrier((vals, toks))

    # With width >= n (DDTree's exact tree) only nodes that can be among the n best overall
    # matter, which prunes harder than the beam's own bounds (`_beam_bounds`).
    exact = width >= n
    # Depth 1: ranks in order, which is best-first.
    w = min(width, k, n) if exact else min(width, k)
    scores, parents, tokens = _beams(vals, toks, w, _depth_plan(w, k, width, n if exact else None, depth), tuning)

    # Global order over all depths: score desc, then depth asc, then position in the beam.
    widths = [s.shape[1] for s in scores]
    offsets = np.concatenate([[0], np.cumsum(widths)])
    all_scores = jnp.concatenate(scores, axis=1)  # [Bt, T]
    depth_of = jnp.asarray(np.repeat(np.arange(1, len(widths) + 1), widths), jnp.int32)  # [T]
    parent_of = jnp.concatenate(
        [parents[0]] + [p + int(offsets[d - 1]) for d, p in enumerate(parents) if d > 0], axis=1)
    token_of = jnp.concatenate(tokens, axis=1)

    n = min(n, all_scores.shape[1])
    runs = _runs_kernel(all_scores.shape[1], tuning)
    # sel: [Bt, n], best first (score desc, then position: depth, then beam position), topological
    gparent = token = None
    if runs:
        _, sel, gparent, token = runs_select(all_scores, n, widths, parent_of, token_of, **runs)
    else:
        (all_scores,) = _materialized(tuning, all_scores)
        sel = select_best(all_scores, None, n, tuning)
    slot_of = jnp.zeros_like(all_scores, jnp.int32)
    slot_of = slot_of.at[jnp.arange(batch)[:, None], sel].set(jnp.arange(1, n + 1, dtype=jnp.int32))
    if gparent is None:
        gparent, token = (jnp.take_along_axis(x, sel, axis=-1) for x in (parent_of, token_of))
    parent_slot = jnp.where(gparent < 0, 0, jnp.take_along_axis(slot_of, jnp.maximum(gparent, 0), axis=-1))

    return tree_from_nodes(
        tokens=token,
        parents=parent_slot,
        depths=jnp.broadcast_to(depth_of[sel], sel.shape),
        num_nodes=num_slots,
        max_depth=depth,
        tuning=tuning,
    )


@register_policy("ddtree")
@dataclasses.dataclass(frozen=True)
class DDTreePolicy(TreePolicy):
    """Best-first tree of exactly `budget` slots (invalid padding only for tiny vocabularies)."""

    def num_nodes(self, budget: int, depth: int) -> int:
        return check_budget(budget) if depth > 0 else 0

    def build(self, logp: Array, budget: int) -> DraftTree:
        budget = check_budget(budget)
        depth = check_logp(logp).shape[1]
        return best_first_tree(logp, budget, width=budget, num_slots=self.num_nodes(budget, depth),
                               tuning=self.tuning)
