"""DDTree's best-first tree (Ringel & Romano 2026): the `budget` most likely rank paths.

A node is a path of ranks `(r1..rd)`; rank `r` at depth `d` is the r-th token of
`top_k(logp[:, d-1])`. Its score is `logp[0, tok(r1)] + ... + logp[d-1, tok(rd)]`, summed in
float32 from depth 1 down. The tree is the `budget` best nodes under the total order

    higher score first; equal scores: lower depth first; then the node whose parent comes
    first in this order; then the lower last rank.

That is the order of DESIGN.md's "handful of top_k calls": each depth's beam is the top of its
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
the position is kept. (Until session 17 equal scores went to the lexicographically smaller rank
path, which cost a rank count of every beam a depth.)

Slots come out in that same best-first order (slot 1 = best path), which is topological.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.trees.base import (BACKENDS, Array, DraftTree, TreePolicy, check_budget, check_logp, env_setting,
                                   flag, one_of, register_policy, tree_from_nodes, whole_number)
from ddtree_jax.kernels.beam_select import beam_select, make_plan
from ddtree_jax.kernels.pair_select import pair_select
from ddtree_jax.kernels.rank_select import rank_select
from ddtree_jax.kernels.runs_select import runs_select
from ddtree_jax.kernels.chunk_topk import (RADIX_BITS, chunk_top_k, from_order_key, index_ordered, order_key,
                                      top_k_total_order)
from ddtree_jax.kernels.select_top import MAX_WIDTH as SELECT_TOP_MAX_WIDTH
from ddtree_jax.kernels.select_top import select_top


# Candidate lists up to this size (per backend) are ranked by pairwise comparison (one fused
# kernel, O(P^2) work); longer ones by one two-key sort. Both give the same order. Chosen by
# bench/bench_tree.py: on the H200 the whole build at B = 256 / 1024 took 0.76 / 1.77 ms with
# limit 1024 and 0.43 / 0.99 ms with 8192 (2026-11-29); on the CPU the sort is faster at every
# size measured. Below B = 256 (P < ~1500) the sort was never timed on a GPU.
# DDTREE_RANK_BY_COUNT_MAX=N in the environment sets every backend (0: always the sort).
RANK_BY_COUNT_MAX = env_setting("DDTREE_RANK_BY_COUNT_MAX", whole_number, {"gpu": 8192, "cpu": 0})


def _count_limit() -> int:
    return RANK_BY_COUNT_MAX.get(jax.default_backend(), 0)


# Per backend: materialize each selection's inputs (an optimization barrier on the candidate
# scores and keys) before ranking them. Found in session 7's H200 HLO (DDTree-64): XLA fuses
# every depth's gather chain back to depth 1 into that depth's pairwise comparison and writes the
# [P, P] comparison out before summing it (the fusions grow from 2.6 to 5.7 us a depth); with the
# inputs materialized the comparison's producers are two [P] arrays. On the H200 (session 8,
# bench_tree, one machine) the build with / without it: 0.376 / 0.403, 0.317 / 0.344,
# 0.409 / 0.419, 0.681 / 0.675 ms at B = 16 / 64 / 256 / 1024 (XLA first stage), 0.196 / 0.214,
# 0.271 / 0.315, 0.699 / 0.708, 0.619 / 0.615 (Pallas first stage): on for GPUs. The values are
# the same either way; DDTREE_SELECT_BARRIER=0 or 1 in the environment overrides every backend.
SELECT_BARRIER: dict[str, bool] = env_setting("DDTREE_SELECT_BARRIER", flag, {"gpu": True})


# Per backend: the largest n * P (selected entries times candidates) for which a depth's
# selection picks its entries' values by one-hot reductions over the ranks (absent: 0, never).
# Without it the count branch inverts the rank permutation with a scatter and then gathers each
# selected entry's score, key, beam row and rank column. The H200 profile of DDTree-1024
# (session 9) shows six kernels a depth: the two compare-and-sum reductions (the rank and the
# lexicographic rank), a scatter (the inverse permutation) and three small loop fusions (the
# candidates and the gathers), launch-bound where P is small (B = 16-64: P ~ 50-300). One-hot
# (`select_onehot`): for each output slot t, max over p of where(rank[p] == t, x[p], fill), the
# four values as sibling reductions over one [n, P] predicate, meant to be one fusion in place of
# the scatter and the gathers; O(n P) work, so only for small selections. The same values either
# way (tests/test_trees.py). n * P was 800 / 17920 / 82560 at every depth for B = 16 / 64 / 128
# when these figures were taken; since session 11's global pruning (`_beam_bounds`) it is at
# most 510 / 13608 / 65659 (depth 2) and shrinks with depth, so 20000 still covers B <= 64.
# H200 (session 10, bench/RESULTS.md): whole build 0.203 -> 0.174 ms at B = 16 and 0.295 ->
# 0.266 at 64; DDTree-64 rounds in three same-call A/Bs, one-hot 0.01-0.10 ms
# faster in each (6.222-6.327 vs 6.236-6.429 steady), DDTree-16 -0.04 to +0.01. So on GPUs up to
# 20000 (B <= 64). B = 128 (100000) built 0.367 vs 0.386 but has no round A/B yet; the CPU has no
# timing and keeps the scatter. DDTREE_SELECT_ONEHOT_MAX=N in the environment sets every backend.
SELECT_ONEHOT_MAX: dict[str, int] = env_setting("DDTREE_SELECT_ONEHOT_MAX", whole_number, {"gpu": 20000})


# Per backend: whether the exact tree (width >= budget) prunes by the global budget as well as
# by the beam's own bound (`_beam_bounds`); the tree is the same either way (tests). On for
# every backend (less work by construction: ~25-50 % fewer pairwise comparisons a depth);
# DDTREE_GLOBAL_PRUNE=0 or 1 in the environment sets every backend, for A/B timings.
GLOBAL_PRUNE: dict[str, bool] = env_setting("DDTREE_GLOBAL_PRUNE", flag, dict.fromkeys(BACKENDS, True))


# Per backend: the largest candidate count a depth (P, the longest pair list of `_beam_bounds`)
# for which every depth's selection runs in one Pallas kernel (`ddtree_jax.kernels.beam_select`: one
# program a batch row, all depths, no launch per depth) instead of XLA's ops (absent: 0, never).
# P is 34 / 216 / 517 at B = 16 / 64 / 128 (exact tree, depth 2). Off the GPU the kernel runs in
# Pallas interpret mode (tests). Off by default everywhere: on the H200 (session 14, bench_tree
# --trace) the kernel alone took 31.7 / 171.6 / 736.2 us of device time at B = 16 / 64 / 128, the
# whole build (wall time a build in the loop) 0.156 / 0.301 / 0.907 ms against XLA's 0.170 /
# 0.197 / 0.280 (device spans 150.6 / 289.5 / 883.6 against 192.3 / 209.5 / 399.2 us): one SM's
# O(P^2) comparisons cost more than the launches they save from B = 64, and the DDTree-16 round
# was unchanged (steady 5.810 / 5.940 against 5.917, per call 6.019 / 6.032 against 6.029).
# Rewritten in session 17 (candidates in registers, no lexicographic rank: s17b, bench_tree
# --trace): the kernel 24.0 / 39.8 / 84.5 / 1476 us at B = 16 / 32 / 64 / 128, the whole build
# 0.119 / 0.123 / 0.188 ms against XLA's 0.116 / 0.130 / 0.131 at B = 16 / 32 / 64; DDTree-64
# rounds 6.137 / 6.143 ms a call with it against 6.077 / 6.076 without, DDTree-16 5.783 against
# 5.806 (one pair, within noise). Still off. Its counts now add into one accumulator reduced once
# (as rank_select's, which that made 3x faster): untimed (no device time for it in sessions 17-18).
# DDTREE_BEAM_KERNEL_MAX=N in the environment sets every backend (e.g. 64 for B <= 16).
BEAM_KERNEL_MAX: dict[str, int] = env_setting("DDTREE_BEAM_KERNEL_MAX", whole_number, {})
# Warps of the kernel's program (DDTREE_BEAM_KERNEL_WARPS=N in the environment; untimed: 8).
BEAM_KERNEL_WARPS: dict[str, int] = env_setting("DDTREE_BEAM_KERNEL_WARPS", whole_number, {"gpu": 8})


def _beam_impl(plan: list) -> str:
    """How the depth loop runs: "xla", or the one-kernel "pallas" (its "pallas_interpret" twin
    off the GPU) where BEAM_KERNEL_MAX covers every depth's candidates."""
    backend = jax.default_backend()
    most = max((len(pairs) for _, pairs, _ in plan), default=0)
    if not plan or most > BEAM_KERNEL_MAX.get(backend, 0):
        return "xla"
    return "pallas" if backend == "gpu" else "pallas_interpret"


def _beam_kernel_options() -> dict:
    warps = BEAM_KERNEL_WARPS.get(jax.default_backend())
    return {"num_warps": warps} if warps else {}


def _materialized(*xs):
    """xs as they are, behind an optimization barrier where SELECT_BARRIER says so."""
    return jax.lax.optimization_barrier(xs) if SELECT_BARRIER.get(jax.default_backend(), False) else xs


def _onehot_applies(n: int, p: int) -> bool:
    return p <= _count_limit() and n * p <= SELECT_ONEHOT_MAX.get(jax.default_backend(), 0)


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


# Per backend: the smallest candidate count P from which a selection of n < P entries (a depth's,
# or the final one over all depths, where select_best would rank all P pairwise or sort them)
# first keeps the n best by `ddtree_jax.kernels.select_top` (one program a row: a radix select of
# the n-th best score, O(P) work, the kept positions in position order) and then ranks only those
# n (`select_ranked`): O(n^2) comparisons instead of O(P^2). The same positions either way
# (tests). Off everywhere (absent, 0): on the H200 (session 15, bench_tree --trace) one
# select_top program is latency-bound, ~0.6 us a radix round: 11 us at P = 1210 (B = 256), 28 us
# at P = 6238 (B = 1024; its two radix selects, score then tie key), against XLA's pairwise rank
# at 7 / 14-23 us, and 289 us over the 16384 lanes of the final selection at B = 1024 (against a
# 52 us sort), where its [width, 4] counts spill: whole build 0.315 -> 0.494 ms at B = 256 and
# 0.545 -> 1.004 at B = 1024. DDTREE_SELECT_TOP_FROM=N in the environment sets every backend
# (off the GPU the kernel runs in interpret mode: tests only).
SELECT_TOP_FROM: dict[str, int] = env_setting("DDTREE_SELECT_TOP_FROM", whole_number, {})


# Per backend: the entry count P from which a selection (a depth's over its candidates, or the
# final one over all depths) runs in `ddtree_jax.kernels.rank_select` (absent: 0, never): one kernel of
# ceil(P / 32) programs a row that ranks by pairwise count and scatters every kept entry with its
# parent and token to its slot, in place of XLA's rank reduction, the inverse permutation's
# scatter and the gathers (~5 kernels a selection), and in place of the final merge
# (FINAL_MERGE_FROM). The same tree (tests; on the H200 check_tree at B = 64 / 256 / 1024 with it
# forced on: all equal, session 17). H200, bench_tree --trace (s17d, one machine start), the
# whole build at B = 1024: 0.486 ms without it, 0.416 with it (32x128 tiles, 4 warps: 14.9 us a
# depth against XLA's 16-19.5 us reduction, the final selection 49 us), **0.374** with 32x256
# tiles and 8 warps (12.7 us a depth); at B = 256 0.229 -> 0.224 (32x128w4; 66 launches instead
# of 111). So on GPUs from 1000 entries (B >= 256's depths and finals; B = 64's 216 candidates
# took 3 us a depth against XLA's ~1.6, s17c), with 32x256 tiles and 8 warps (timed at B = 1024
# only). No round A/B yet (s17d's DDTree-256 pair ran out of its step's time). Since session 18
# PAIR_KERNEL_FROM (depths) and RUNS_KERNEL_FROM (the final selection) are checked first, so on
# GPUs it ranks only what they are set to leave.
# DDTREE_RANK_KERNEL_FROM=N in the environment sets every backend (0: never; off the GPU the
# kernel runs in interpret mode: tests only).
RANK_KERNEL_FROM: dict[str, int] = env_setting("DDTREE_RANK_KERNEL_FROM", whole_number, {"gpu": 1000})


def rank_tile_setting(text: str) -> dict:
    """rank_select's launch options from TIxTJ[wWARPS] (e.g. 32x128w4)."""
    m = re.fullmatch(r"(\d+)x(\d+)(?:w(\d+))?", text)
    if not m or any(int(x) & (int(x) - 1) or not int(x) for x in m.groups() if x):
        raise ValueError("give TIxTJ[wWARPS] in powers of two, e.g. 32x128w4")
    ti, tj, warps = m.groups()
    return dict(ti=int(ti), tj=int(tj), **({"num_warps": int(warps)} if warps else {}))


# Per backend: rank_select's launch options (its defaults otherwise: ti 32, tj 128, 4 warps).
# H200 (s17d), the whole build at B = 1024: 32x128w4 0.416 ms, 64x128w4 0.457, 32x256w8 0.374.
# DDTREE_RANK_KERNEL_TILE=TIxTJ[wWARPS] in the environment sets every backend.
RANK_KERNEL_TILE: dict[str, dict] = env_setting("DDTREE_RANK_KERNEL_TILE", rank_tile_setting,
                                                {"gpu": dict(ti=32, tj=256, num_warps=8)})


def _kernel_options(start_from: dict, tiles: dict, p: int) -> dict | None:
    """A selection kernel's keyword arguments for p entries where this backend's `start_from`
    setting turns it on (impl "pallas", or off the GPU "pallas_interpret", and the backend's
    launch options from `tiles`), or None where it does not run."""
    backend = jax.default_backend()
    start = start_from.get(backend, 0)
    if not start or p < start:
        return None
    return dict(impl="pallas" if backend == "gpu" else "pallas_interpret", **tiles.get(backend, {}))


def _rank_kernel(p: int) -> dict | None:
    """rank_select's keyword arguments for a selection over p entries, or None."""
    return _kernel_options(RANK_KERNEL_FROM, RANK_KERNEL_TILE, p)


# Per backend: the candidate count P from which a depth's selection runs in
# `ddtree_jax.kernels.pair_select` (absent: 0, never): one kernel that ranks each candidate (i, r) by
# binary searches of the previous beam and the depth's ranked log-probs (both sorted, so every
# row and column of the candidate staircase is), ~(A + 2C) log2 steps a candidate instead of
# rank_select's P comparisons, and scatters the kept sums with parent and token; no candidate
# array, no gathers. Checked before RANK_KERNEL_FROM. The same tree (tests; on the H200
# check_tree at B = 256 / 1024 with it: all equal, session 18). H200, bench_tree --trace (s18_1,
# one machine start), the whole build without / with it (runs_select on from 1000 in both):
# B = 64 0.127 / 0.126 ms (span 144 / 131 us, 66 / 38 launches; 3.8 us a depth), 128 0.178 /
# 0.162, 256 0.211 / 0.190, 512 0.226 / 0.214, 1024 0.336 / 0.264 (9.7 us a depth against
# rank_select's 12.5 and XLA's candidate gathers) and 0.231 with 16x32 tiles (7.2 us a depth).
# So on GPUs from 100 candidates (B >= ~40). DDTREE_PAIR_KERNEL_FROM=N in the environment sets
# every backend (0: never; off the GPU the kernel runs in interpret mode: tests only).
PAIR_KERNEL_FROM: dict[str, int] = env_setting("DDTREE_PAIR_KERNEL_FROM", whole_number, {"gpu": 100})


def pair_tile_setting(text: str) -> dict:
    """pair_select's launch options from TIxA[wWARPS] (e.g. 32x32w4)."""
    tiles = rank_tile_setting(text)
    return dict(ti=tiles["ti"], a=tiles["tj"], **({"num_warps": tiles["num_warps"]} if "num_warps" in tiles else {}))


# Per backend: pair_select's launch options (its defaults otherwise: ti 32, a 32, 4 warps).
# H200 (s18_1), the whole build at B = 1024: 16x32w4 0.231 ms, 32x32w8 0.248, 32x32w4 0.264,
# 32x64w4 0.280, 32x16w4 0.281, 64x32w4 0.316, 32x32w2 0.318.
# DDTREE_PAIR_KERNEL_TILE=TIxA[wWARPS] in the environment sets every backend.
PAIR_KERNEL_TILE: dict[str, dict] = env_setting("DDTREE_PAIR_KERNEL_TILE", pair_tile_setting,
                                                {"gpu": dict(ti=16, a=32, num_warps=4)})


def _pair_kernel(p: int) -> dict | None:
    """pair_select's keyword arguments for a depth of p candidates, or None."""
    return _kernel_options(PAIR_KERNEL_FROM, PAIR_KERNEL_TILE, p)


# Per backend: the entry count T over all depths from which the final selection runs in
# `ddtree_jax.kernels.runs_select` (absent: 0, never): every depth's beam is a run sorted best first,
# so an entry's rank is its offset in its run plus, per other run, a binary search (O(T D log W)
# instead of rank_select's O(T^2)), in one kernel that also carries each kept entry's parent and
# token to its slot. Checked before RANK_KERNEL_FROM and FINAL_MERGE_FROM. The same tree (tests).
# H200 (session 18, the kernel alone, profiler): 5.5 us at B = 1024's final shape (T ~14.3k)
# against rank_select's 44 us + a 4 us copy; 3.3 us at B = 256's. The whole build (bench_tree
# --trace, s18_1), rank_select / runs_select final: B = 1024 0.382 / 0.336 ms with rank_select's
# depths, 0.306 / 0.264 with pair_select's; B = 256 0.207 / 0.211 and 0.206 / 0.190 (with it the
# concatenated parents and tokens are 3 more launches). DDTREE_RUNS_KERNEL_FROM=N in the
# environment sets every backend (0: never; off the GPU the kernel runs in interpret mode).
RUNS_KERNEL_FROM: dict[str, int] = env_setting("DDTREE_RUNS_KERNEL_FROM", whole_number, {"gpu": 1000})


def _runs_kernel(t: int) -> dict | None:
    """runs_select's keyword arguments for a final selection over t entries, or None."""
    return _kernel_options(RUNS_KERNEL_FROM, {}, t)


def _row_lengths(pairs: list[tuple[int, int]]) -> tuple[int, ...]:
    """Per beam row i, how many ranks r its candidates (i, 0..r-1) take (`_beam_bounds` lists
    them row by row, ranks from 0, row lengths non-increasing)."""
    rows = np.asarray([i for i, _ in pairs])
    return tuple(np.bincount(rows).tolist())


def _select_top_impl(p: int, n: int) -> str | None:
    """How a selection of n of p entries prefilters: None (it does not), "pallas" or, off the
    GPU, "pallas_interpret"."""
    backend = jax.default_backend()
    start = SELECT_TOP_FROM.get(backend, 0)
    if not start or p < start or n >= p or p > SELECT_TOP_MAX_WIDTH:
        return None
    return "pallas" if backend == "gpu" else "pallas_interpret"


def select_ranked(scores: Array, keys: Array, n: int) -> Array:
    """`select_best`'s positions, through the select_top prefilter where SELECT_TOP_FROM says so:
    the n best kept first (in position order), then ordered among themselves by select_best."""
    impl = _select_top_impl(scores.shape[1], n)
    if impl is None:
        return select_best(scores, keys, n)
    # zeros_equal: select_best's `>` ranks -0.0 and +0.0 equal (then by key); so must the prefilter
    pos = select_top(scores, n, keys, zeros_equal=True, impl=impl)
    kept = _materialized(jnp.take_along_axis(scores, pos, axis=-1), jnp.take_along_axis(keys, pos, axis=-1))
    return jnp.take_along_axis(pos, select_best(*kept, n), axis=-1)


# Per backend: the entry count over all depths (T, ~14.3k at B = 1024) from which the final
# selection ranks the entries by merging the depths' beams (`_merged_ranks`: each beam is already
# best-first, so an entry's global rank is its position in its beam plus, for every other beam,
# how many of its entries beat it, found by a binary search: O(T D log W) work in a few fusions)
# instead of select_best's pairwise count or sort. The same tree (tests; on the H200 check_tree
# at B = 256 / 1024 with it: all equal, session 16 s16a). H200, bench_tree --trace, one call: the
# whole build at B = 1024 (T ~14.3k) 0.555 -> 0.500 ms, device span 568.6 -> 533.2 us (XLA's
# 52 us sort gone); at B = 256 (T ~3.6k) 0.267 -> 0.275, span 272.6 -> 301.1 (the pairwise rank
# there is cheaper). So on GPUs from 8192 entries (B = 512, T ~7.5k, is untimed and keeps the
# rank). DDTREE_FINAL_MERGE_FROM=N in the environment sets every backend (0: never). Since session
# 17 RANK_KERNEL_FROM (checked first) takes these selections on GPUs.
FINAL_MERGE_FROM: dict[str, int] = env_setting("DDTREE_FINAL_MERGE_FROM", whole_number, {"gpu": 8192})


def _merged_ranks(scores: list[Array]) -> Array:
    """Global rank of every entry of the depths' beams under (score desc, depth asc, position
    asc), concatenated by depth: int32[Bt, T]. scores[d]: float32[Bt, w_d], best first (score
    desc, then position), as the depth loop keeps them. An entry at position p of beam d is beaten by the
    p before it there, by the entries of a shallower beam scoring >= it and by those of a deeper
    beam scoring > it (`>` as select_best compares: -0.0 == +0.0); each count is a binary search
    of the sorted beam, unrolled, so the whole rank is a few gather fusions."""
    batch = scores[0].shape[0]
    widths = [x.shape[1] for x in scores]
    depths, stride = len(scores), max(widths)
    beams = jnp.stack([jnp.pad(x, ((0, 0), (0, stride - x.shape[1]))) for x in scores], axis=1)  # [Bt, D, W]
    query = jnp.concatenate(scores, axis=1)                                                     # [Bt, T]
    depth_of = np.repeat(np.arange(depths), widths)                                             # [T]
    own = np.concatenate([np.arange(w) for w in widths])
    q = jnp.broadcast_to(query[:, None, :], (batch, depths, query.shape[1]))
    steps = max(1, int(np.ceil(np.log2(stride + 1))))

    def count(strict: bool) -> Array:
        # per (beam d2, entry): #{x in beam d2: x > q} (strict) or #{x >= q}; beams descending
        lo = jnp.zeros(q.shape, jnp.int32)
        hi = jnp.broadcast_to(jnp.asarray(widths, jnp.int32)[None, :, None], q.shape)
        for _ in range(steps):
            mid = (lo + hi) // 2
            x = jnp.take_along_axis(beams, jnp.minimum(mid, stride - 1), axis=2)
            beats = (x > q) if strict else (x >= q)
            go_right = (lo < hi) & beats
            lo, hi = jnp.where(go_right, mid + 1, lo), jnp.where((lo < hi) & ~beats, mid, hi)
        return lo

    shallower = jnp.asarray(np.arange(depths)[:, None] < depth_of[None, :])   # [D, T]: beam d2 above the entry
    deeper = jnp.asarray(np.arange(depths)[:, None] > depth_of[None, :])
    beaten = jnp.where(shallower, count(False), 0) + jnp.where(deeper, count(True), 0)
    return (jnp.asarray(own, jnp.int32) + beaten.sum(axis=1)).astype(jnp.int32)


def select_best(scores: Array, keys: Array, n: int) -> Array:
    """Positions of the n best entries, best first, under (score desc, key asc); keys distinct.

    scores float32[Bt, P], keys int32[Bt, P]. Returns int32[Bt, n] indices into P.
    """
    p = scores.shape[1]
    if p <= _count_limit():
        return _invert(_rank(scores, keys), n)
    # 0 - x: descending by score, and -0.0 and +0.0 compare equal as in the ranked branch
    idx = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), scores.shape)
    return jax.lax.sort((0.0 - scores, keys, idx), dimension=1, num_keys=2)[2][:, :n]


# Two-stage vocabulary top-k by backend (absent: one lax.top_k), from
# bench/bench_tree.py on the H200, D=15 x V=151936: one top_k took 0.59 ms for K=64..1024; 128
# chunks keeping all K per chunk took 0.21 / 0.24 / 0.51 ms at K=64 / 256 / 1024 (at K=1024 the
# second stage still sorts 131k candidates a row). Keeping at most 64 per chunk bounds the
# second stage at 8192 candidates: 0.22 ms at K=256 and 1024 (session 4). That needs a lax.cond
# (its exact fallback), which on a GPU may cost a host round-trip for the predicate, so it is
# used from K >= 512 only (at K=256 it saved 0.03 ms). On the CPU the single top_k is faster.
# stage1: "xla" (lax.top_k per chunk, a sort) or "pallas" (ddtree_jax.kernels.chunk_topk: no sort,
# `keep` max-reductions over the chunk), the latter only where a chunk keeps at most
# `pallas_keep_max`: the whole build with it, session 8 (H200, with SELECT_BARRIER): 0.196 /
# 0.271 / 0.699 / 0.619 ms at B = 16 / 64 / 256 / 1024 (keeping 16 / 64 / 256 / 64 a chunk)
# against 0.376 / 0.317 / 0.409 / 0.681 with XLA's sort.
# "threshold" (the chunk's keep-th key by radix select, then one pass: work independent of keep)
# replaced "pallas" in session 11 (H200, bench_tree whole build with the ancestor mask, pallas vs
# threshold: 0.181 / 0.276 / 0.432 / 0.635 vs 0.185 / 0.208 / 0.312 / 0.559 ms at B = 16 / 64 /
# 256 / 1024; at 256 it also replaces XLA's sort; the first stage alone, 128 chunks keeping 64,
# 0.171 vs 0.096 ms at 64; DDTree-64 round, two interleaved A/Bs, 6.337 / 6.351 vs 6.269 / 6.259
# ms steady, DDTree-256 10.003 / 10.016 vs 9.924 / 10.004). `pallas_keep_max` limits "pallas".
# stage2_max_k (session 14): up to this K (where every chunk keeps all K) the second stage is
# `_second_stage_by_threshold` (the threshold kernel over chunks of 1024 candidates, then a
# pairwise order of the survivors) instead of lax.top_k, which on the H200 ran XLA's TopK kernel
# at K = 16 (45.3 us) and a sort at K = 64 (32.3 us); with it 6.4 us + small fusions. Whole
# build (bench_tree --trace, one call): 0.172 -> 0.132 ms at B = 16, 0.204 -> 0.165 at B = 64.
VOCAB_TOPK = {"gpu": dict(chunks=128, keep=64, keep_from_k=512, stage1="threshold", pallas_keep_max=64,
                          stage2_max_k=64, stage2_select=True)}
# stage2_select (session 15): past stage2_max_k the second stage is `_second_stage_by_select`
# (select_top: a radix select of the K-th best, one program a row, then a pairwise order of the
# K kept) instead of lax.top_k's sort. H200 (s15c, bench_tree --stage2-select 0,1 --trace): the
# whole build 0.276 -> 0.274 / 0.315 -> 0.288 / 0.545 -> 0.537 ms at B = 128 / 256 / 1024 (its
# 32.3 us sort -> 8.9-21.2 us of select_top); DDTree-256 rounds unchanged within noise. An entry
# may set `select_radix_bits` / `select_num_warps` for its select_top (untimed; 2 bits a round).
# An entry may also hold the kernel's `num_warps` and `radix_bits` (chunk_top_k's defaults
# otherwise: 4 warps, 2 bits a round; session 11's sweep at 128 chunks keeping 64: radix 1 / 2 /
# 4 bits 0.104 / 0.096 / 0.134 ms, 1 / 2 / 4 / 8 warps 0.117 / 0.105 / 0.096 / 0.106 at B = 64).
# DDTREE_VOCAB_STAGE1=xla|pallas|threshold sets the first stage wherever the top-k has two
# (ddtree_jax.kernels.chunk_topk: "threshold" is the kernel whose work does not grow with keep),
# optionally with its options after a colon: threshold:r4w2 (radix bits 4, 2 warps), pallas:w8.


def stage1_setting(text: str) -> dict:
    """The VOCAB_TOPK fields that a first-stage setting ("threshold:r4w2", ...) names."""
    name, _, opts = text.partition(":")
    one_of("xla", "pallas", "threshold")(name)
    m = re.fullmatch(r"(?:r(\d+))?(?:w(\d+))?", opts)
    if not m or (name == "xla" and opts) or (name == "pallas" and m.group(1)):
        raise ValueError("options follow a kernel's name as :rBITSwWARPS (threshold) or :wWARPS")
    bits, warps = m.groups()
    if bits and int(bits) not in RADIX_BITS:
        raise ValueError(f"radix bits are one of {', '.join(map(str, RADIX_BITS))}")
    return dict(stage1=name, **({"radix_bits": int(bits)} if bits else {}),
                **({"num_warps": int(warps)} if warps else {}))


for _backend, _setting in env_setting("DDTREE_VOCAB_STAGE1", stage1_setting, {}).items():
    if _backend in VOCAB_TOPK:
        VOCAB_TOPK[_backend] = dict(VOCAB_TOPK[_backend], **_setting)
# DDTREE_VOCAB_STAGE2_MAX_K=N sets stage2_max_k wherever the top-k has two stages (0: lax.top_k).
for _backend, _k in env_setting("DDTREE_VOCAB_STAGE2_MAX_K", whole_number, {}).items():
    if _backend in VOCAB_TOPK:
        VOCAB_TOPK[_backend] = dict(VOCAB_TOPK[_backend], stage2_max_k=_k)
# DDTREE_VOCAB_STAGE2_SELECT=0 or 1 sets stage2_select wherever the top-k has two stages.
for _backend, _on in env_setting("DDTREE_VOCAB_STAGE2_SELECT", flag, {}).items():
    if _backend in VOCAB_TOPK:
        VOCAB_TOPK[_backend] = dict(VOCAB_TOPK[_backend], stage2_select=_on)


def _vocab_top_k_settings(k: int) -> tuple[int | None, int | None, str]:
    """(chunks, keep, stage1) of `vocab_top_k` for this backend and K."""
    cfg = VOCAB_TOPK.get(jax.default_backend())
    if not cfg:
        return None, None, "xla"
    keep = cfg["keep"] if k >= cfg.get("keep_from_k", 0) else None
    stage1 = cfg.get("stage1", "xla")
    if stage1.startswith("pallas") and min(k, keep or k) > cfg.get("pallas_keep_max", k):
        stage1 = "xla"      # the extraction kernel's work grows with keep; the threshold's does not
    return cfg["chunks"], keep, stage1


def _stage2(k: int) -> str:
    """The second stage of `vocab_top_k` for this backend and K: "threshold" where VOCAB_TOPK's
    `stage2_max_k` covers K and every chunk keeps all K; else "select" where its `stage2_select`
    is on and the candidates fit `_second_stage_by_select`; else "xla". Off the GPU the kernels'
    "_interpret" twins."""
    backend = jax.default_backend()
    cfg = VOCAB_TOPK.get(backend) or {}
    chunks, keep, _ = _vocab_top_k_settings(k)
    if not chunks:
        return "xla"
    suffix = "" if backend == "gpu" else "_interpret"
    if keep is None and k <= cfg.get("stage2_max_k", 0):
        return "threshold" + suffix
    n = chunks * min(keep or k, k)
    c = _select_chunking(n, k)
    if cfg.get("stage2_select") and k < n and (c * k if c > 1 else n) <= SELECT_TOP_MAX_WIDTH:
        return "select" + suffix
    return "xla"


def _stage1_options() -> dict:
    """The first-stage kernel's launch options in VOCAB_TOPK (`num_warps`, `radix_bits`)."""
    cfg = VOCAB_TOPK.get(jax.default_backend()) or {}
    return {name: cfg[name] for name in ("num_warps", "radix_bits") if name in cfg}


def _select_options() -> dict:
    """select_top's launch options in VOCAB_TOPK (`select_radix_bits`, `select_num_warps`) for
    the select second stage (select_top's defaults otherwise: 2 bits a round, warps by width)."""
    cfg = VOCAB_TOPK.get(jax.default_backend()) or {}
    return {name[7:]: cfg[name] for name in ("select_radix_bits", "select_num_warps") if name in cfg}


def vocab_top_k(logp: Array, k: int, chunks: int | None = None,
                keep: int | None = None, stage1: str = "xla", stage2: str = "xla",
                select_options: dict | None = None, **stage1_options) -> tuple[Array, Array]:
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
    "xla", "pallas", "threshold", or either kernel's "_interpret" twin). Every impl keeps the
    same candidates; "threshold" lists each chunk's by token index instead of by rank, which
    the second stage's sort makes no difference to (chunk-major index order is token order, so
    its lower-position-first tie rule still picks the lower token). stage1_options go to
    chunk_top_k (num_warps, radix_bits; the XLA stage ignores them).

    stage2: "xla" (one `lax.top_k` over the candidates, a sort on GPUs), a threshold impl
    ("threshold" / "threshold_interpret": `_second_stage_by_threshold`), only where every chunk
    keeps all k (no exactness check needed), or a select impl ("select" / "select_interpret":
    `_second_stage_by_select`, any k; select_options go to its select_top: radix_bits,
    num_warps).
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
        out = _second_stage_by_select(vals, idx, k, stage2.endswith("_interpret"), select_options or {},
                                      **stage1_options)
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
    at K <= 16, ranks -0.0 and +0.0 as equal instead), without a sort: the threshold kernel keeps the k best of every
    STAGE2_CHUNK candidates (its ties by lower position, which is token order among equal
    values: chunk-major candidates, each chunk's listed by token or, for equal values, by lower
    token first), then `select_onehot` orders the c * k survivors by (total-order key desc,
    token asc) and picks the k best. O((c k)^2) a row: for small k only (VOCAB_TOPK's
    stage2_max_k)."""
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


def _second_stage_by_select(vals: Array, idx: Array, k: int, interpret: bool, select_options: dict,
                            **options) -> tuple[Array, Array]:
    """The top k of the first stage's candidates (vals [..., n] with token indices idx) in
    `lax.top_k`'s order, as `_second_stage_by_threshold` but for any k: the threshold kernel
    first keeps the k best of every STAGE2_CHUNK candidates where that halves them at least
    (`_select_chunking`), then `select_top` keeps the k best of the rest (ties by lower position:
    token order among equal values, see `_second_stage_by_threshold`), and a pairwise rank of
    those k (total-order key desc, position asc) orders them: O(k^2) a row instead of a sort.
    options go to the threshold kernel, select_options to select_top."""
    lead, n = vals.shape[:-1], vals.shape[-1]
    c = _select_chunking(n, k)
    v, tok = vals.reshape(-1, n), idx.reshape(-1, n)
    if c > 1:
        v, pos = chunk_top_k(v, c, k, impl="threshold_interpret" if interpret else "threshold", **options)
        v, tok = v.reshape(-1, c * k), jnp.take_along_axis(tok, pos.reshape(-1, c * k), axis=-1)
    pos = select_top(v, k, impl="pallas_interpret" if interpret else "pallas", **select_options)
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


def _beams_xla(vals: Array, toks: Array, w: int, plan: list) -> tuple[list, list, list]:
    """Every depth's beam (scores, parents, tokens; one [Bt, width] array a depth), by XLA ops: a
    selection (`select_best` or `select_onehot`) a depth. A candidate's key is its position in the
    depth's pair list, which `_beam_bounds` lists by (parent's beam position, rank): static."""
    batch = vals.shape[0]
    score = vals[:, 0, :w]
    scores, parents, tokens = [score], [jnp.full((batch, w), -1, jnp.int32)], [toks[:, 0, :w]]
    for d, (_, pairs, n_sel) in enumerate(plan, start=1):
        pair_kernel, kernel = _pair_kernel(len(pairs)), _rank_kernel(len(pairs))
        rows, cols = (np.asarray(x, np.int32) for x in zip(*pairs))
        if pair_kernel:
            # The arrays in place (the depth as an index, depth 1's beam as row 0 of vals): no
            # XLA copies of their slices in front of the kernel.
            beam, beam_depth = (vals, 0) if d == 1 else (score, None)
            score, parent, token = pair_select(beam, vals, toks, n_sel, _row_lengths(pairs), depth=d,
                                               beam_depth=beam_depth, **pair_kernel)
        elif kernel:
            cand = score[:, rows] + vals[:, d, cols]
            rows_b = jnp.broadcast_to(jnp.asarray(rows), cand.shape)
            score, _, parent, token = rank_select(cand, n_sel, rows_b, toks[:, d, cols], **kernel)
        else:
            (cand,) = _materialized(score[:, rows] + vals[:, d, cols])
            key = jnp.broadcast_to(jnp.arange(len(pairs), dtype=jnp.int32), cand.shape)
            if _onehot_applies(n_sel, len(pairs)):
                rows_b, cols_b = (jnp.broadcast_to(jnp.asarray(x), cand.shape) for x in (rows, cols))
                score, _, parent, col = select_onehot(cand, key, n_sel, rows_b, cols_b)
                (score,) = _materialized(score)
            else:
                sel = select_ranked(cand, key, n_sel)
                (score,) = _materialized(jnp.take_along_axis(cand, sel, axis=-1))
                parent, col = jnp.asarray(rows)[sel], jnp.asarray(cols)[sel]
            token = jnp.take_along_axis(toks[:, d], col, axis=-1)
        scores.append(score)
        parents.append(parent)
        tokens.append(token)
    return scores, parents, tokens


def best_first_tree(logp: Array, budget: int, width: int, num_slots: int) -> DraftTree:
    """The `budget` best nodes among those reached by a beam of `width` per depth.

    `width >= budget` gives DDTree's exact best-first tree. Slots beyond the number of distinct
    beam nodes (tiny vocabularies) are padded invalid up to `num_slots` nodes.

    Each depth's beam is kept in best-first order (score desc, position asc), so a depth costs
    one selection (`select_best`) and the next depth's candidates are listed in key order.
    """
    logp = check_logp(logp)
    batch, depth, vocab = logp.shape
    n = min(budget, num_slots)
    if n == 0 or depth == 0 or vocab == 0 or width == 0:
        empty = jnp.zeros((batch, 0), jnp.int32)
        return tree_from_nodes(empty, empty, empty, num_slots, depth)
    k = min(width, vocab)
    # [Bt, D, K]: rank r -> (log-prob, token)
    vals, toks = vocab_top_k(logp, k, *_vocab_top_k_settings(k), stage2=_stage2(k), select_options=_select_options(),
                             **_stage1_options())
    # Without the barrier XLA:CPU fuses the vocabulary-wide top-k into each consumer and runs it
    # again per depth: 30 ms instead of 0.5 ms for B=16, D=15, V=8192 (measured here).
    vals, toks = jax.lax.optimization_barrier((vals, toks))

    # With width >= n (DDTree's exact tree) only nodes that can be among the n best overall
    # matter, which prunes harder than the beam's own bounds (`_beam_bounds`).
    exact = width >= n and GLOBAL_PRUNE.get(jax.default_backend(), True)
    # Depth 1: ranks in order, which is best-first.
    w = min(width, k, n) if exact else min(width, k)
    plan = _depth_plan(w, k, width, n if exact else None, depth)
    impl = _beam_impl(plan)
    if impl != "xla":
        scores, parents, tokens = beam_select(vals, toks, make_plan(w, plan), interpret=impl == "pallas_interpret",
                                              **_beam_kernel_options())
    else:
        scores, parents, tokens = _beams_xla(vals, toks, w, plan)

    # Global order over all depths: score desc, then depth asc, then position in the beam.
    widths = [s.shape[1] for s in scores]
    offsets = np.concatenate([[0], np.cumsum(widths)])
    all_scores = jnp.concatenate(scores, axis=1)  # [Bt, T]
    depth_of = jnp.asarray(np.repeat(np.arange(1, len(widths) + 1), widths), jnp.int32)  # [T]
    parent_of = jnp.concatenate(
        [parents[0]] + [p + int(offsets[d - 1]) for d, p in enumerate(parents) if d > 0], axis=1)
    token_of = jnp.concatenate(tokens, axis=1)

    n = min(n, all_scores.shape[1])
    merge_from = FINAL_MERGE_FROM.get(jax.default_backend(), 0)
    runs, kernel = _runs_kernel(all_scores.shape[1]), _rank_kernel(all_scores.shape[1])
    # sel: [Bt, n], best first (score desc, then position: depth, then beam position), topological
    gparent = token = None
    if runs:
        _, sel, gparent, token = runs_select(all_scores, n, widths, parent_of, token_of, **runs)
    elif kernel:
        sel = rank_select(all_scores, n, **kernel)[1]
    elif merge_from and all_scores.shape[1] >= merge_from:
        sel = _invert(_merged_ranks(scores), n)
    else:
        (all_scores,) = _materialized(all_scores)
        positions = jnp.broadcast_to(jnp.arange(all_scores.shape[1], dtype=jnp.int32), all_scores.shape)
        sel = select_ranked(all_scores, positions, n)
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
        return best_first_tree(logp, budget, width=budget, num_slots=self.num_nodes(budget, depth))
