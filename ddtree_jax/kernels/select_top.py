"""The `m` best entries of each row under (score desc, tie key asc), as one Pallas program a row:
which positions, listed in ascending position order (no sort).

Why: the tree build ranks a depth's candidates by pairwise count (O(P^2): ~38 M comparisons a
depth at budget 1024, 14-23 us each on the H200, ~0.22 ms of the 0.54 ms build; session 14's
trace) and sorts its vocabulary second stage (57 us at K = 1024) and its final selection over
all depths (32 us), where only the best m of P entries are kept. Selecting first and ordering the
m survivors after cuts the comparisons to O(P) here plus O(m^2) there.

How: the threshold kernel of `chunk_topk` generalized to any tie key. The row's scores become
int32 keys in the float total order (`order_key`: -0.0 below +0.0); their m-th largest is built a
few bits a round (32 / radix_bits rounds of compare-and-count); every entry above it is kept;
among the entries equal to it, the `need` with the smallest tie keys, found the same way on the
bit-inverted tie keys (their need-th largest). A prefix count then places the kept positions in
slots 0..m-1 by position. Exact for any input: ties of score, signed zeros, -inf; tie keys must
be distinct within a row (positions, when none are given, are).

Status (H200, session 15, bench/RESULTS.md): the GPU default for the vocabulary second stage past
K = 64 (`ddtree.VOCAB_TOPK`'s stage2_select: 8.9-21.2 us in place of a 32 us sort). As a
prefilter of the depths' selections it is off (`ddtree.SELECT_TOP_FROM`): one program's 16
radix rounds are latency-bound (~0.6 us a round; 28 us at 6238 candidates against XLA's 14-23 us
pairwise rank), and at 16384 lanes its [width, 4] counts spill (289 us).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .chunk_topk import RADIX_BITS, kept_slots, kth_largest, order_key, take_by_position
from .norms import _pow2_at_least, pltriton

__all__ = ["select_top", "select_top_reference", "score_key", "IMPLS", "MAX_WIDTH"]

IMPLS = ("xla", "pallas", "pallas_interpret")
# Widest row one program holds (values in registers: 32 a thread on 16 warps).
MAX_WIDTH = 16384


def score_key(x: jax.Array, zeros_equal: bool = False) -> jax.Array:
    """int32 keys of float scores in the float total order (`order_key`), or with zeros_equal
    in the float comparison's order (-0.0 == +0.0; both key 0, +0.0's)."""
    key = order_key(x)
    return jnp.where(x == 0, 0, key) if zeros_equal else key


def select_top_reference(scores: jax.Array, m: int, tie: jax.Array | None = None,
                         zeros_equal: bool = False) -> jax.Array:
    """XLA path: one sort by (score key desc, tie asc), its first m positions, ascending.
    scores float [..., P]; tie int32 [..., P] or None (positions). Returns int32 [..., m]."""
    p = scores.shape[-1]
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), scores.shape)
    tie = pos if tie is None else tie
    # ~key: descending by the score key, as an ascending sort key
    first = lax.sort((~score_key(scores, zeros_equal), tie, pos), dimension=scores.ndim - 1,
                     num_keys=2)[2][..., :m]
    return jnp.sort(first, axis=-1)


def _select_kernel(*refs, p: int, width: int, m: int, m_pad: int, radix_bits: int, has_tie: bool,
                   zeros_equal: bool):
    """One row: scores s_ref [P] (and tie keys t_ref [P]) -> pos_ref [m_pad], slots 0..m-1."""
    if has_tie:
        s_ref, t_ref, pos_ref = refs
    else:
        (s_ref, pos_ref), t_ref = refs, None
    lane = jnp.arange(width, dtype=jnp.int32)
    valid = lane < p
    at = jnp.minimum(lane, p - 1)
    x = pltriton.load(s_ref.at[at], mask=valid, other=-jnp.inf).astype(jnp.float32)
    key = score_key(x, zeros_equal)
    kth = kth_largest(key, valid, m, radix_bits)
    if has_tie:
        above = valid & (key > kth)
        tied = valid & (key == kth)
        need = m - jnp.sum(jnp.where(above, 1, 0))                  # 1 <= need <= #tied
        tie = pltriton.load(t_ref.at[at], mask=valid, other=0)
        # the need smallest tie keys among the tied: the need-th largest of ~tie (order reversing)
        inv = ~tie
        take = above | (tied & (inv >= kth_largest(inv, tied, need, radix_bits)))
    else:       # positions: the lowest tied positions first
        take = take_by_position(key, valid, m, kth)
    slot = kept_slots(take, m, m_pad)
    pltriton.store(pos_ref.at[slot], lane, mask=take)


def _num_warps(width: int) -> int:
    # ~16-32 values a thread (chunk_topk's 2048-lane programs run 4 warps).
    return int(min(16, max(4, width // 512)))


def select_top(scores: jax.Array, m: int, tie: jax.Array | None = None, *, zeros_equal: bool = False,
               impl: str = "pallas", radix_bits: int = 2, num_warps: int | None = None) -> jax.Array:
    """Positions of the m best entries of each row of scores [..., P] under (score desc in the
    float total order, -0.0 below +0.0, or with zeros_equal as `>` compares, -0.0 == +0.0; then
    tie asc), in ascending position order: int32 [..., m]. tie: int32 [..., P], distinct within
    a row (None: the positions, i.e. the lower position first on equal scores, lax.top_k's rule).

    impl: "pallas" (one program a row), "pallas_interpret" (the same kernel on any backend, for
    tests) or "xla" (`select_top_reference`: a sort). radix_bits (1, 2 or 4) and num_warps do
    not change the result.
    """
    p = scores.shape[-1]
    if not 1 <= m <= p:
        raise ValueError(f"select_top: m={m} must be within 1..{p} (the row's length)")
    if tie is not None and tie.shape != scores.shape:
        raise ValueError(f"select_top: tie keys {tie.shape} must match the scores {scores.shape}")
    if impl == "xla":
        return select_top_reference(scores, m, tie, zeros_equal)
    if impl not in IMPLS:
        raise ValueError(f"unknown select_top impl {impl!r}; choose one of {', '.join(IMPLS)}")
    if radix_bits not in RADIX_BITS:
        raise ValueError(f"select_top: radix_bits={radix_bits}; choose one of {RADIX_BITS}")
    width = _pow2_at_least(p)
    if width > MAX_WIDTH:
        raise ValueError(f"select_top: rows of {p} entries do not fit one program (at most {MAX_WIDTH}); "
                         f"use impl='xla'")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module; use impl='xla'")
    lead = scores.shape[:-1]
    rows = math.prod(lead)
    interpret = impl == "pallas_interpret"
    m_pad = _pow2_at_least(m)
    if interpret and m == m_pad:
        m_pad += 1          # a spare slot for the masked-off lanes (see _select_kernel)
    warps = num_warps or _num_warps(width)
    params = None if interpret else pltriton.CompilerParams(num_warps=warps, num_stages=1)
    inputs = [scores.reshape(rows, p)] + ([] if tie is None else [tie.astype(jnp.int32).reshape(rows, p)])
    pos = pl.pallas_call(
        functools.partial(_select_kernel, p=p, width=width, m=m, m_pad=m_pad, radix_bits=radix_bits,
                          has_tie=tie is not None, zeros_equal=zeros_equal),
        grid=(rows,),
        in_specs=[pl.BlockSpec((None, p), lambda r: (r, 0))] * len(inputs),
        out_specs=pl.BlockSpec((None, m_pad), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, m_pad), jnp.int32),
        compiler_params=params,
        interpret=interpret,
        name="select_top",
    )(*inputs)
    return pos[:, :m].reshape(*lead, m)
