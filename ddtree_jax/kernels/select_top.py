"""The `m` best entries of each row under (score desc, position asc), as one Pallas program a row:
which positions, listed in ascending position order (no sort).

Why: the tree build's vocabulary top-k sorts its second stage's candidates (32 us at K = 256 on
the H200, 57 us at K = 1024) where only the best K are kept. Selecting first and ordering the K
survivors after cuts that to O(P) here plus O(K^2) there: 8.9-21.2 us (`VocabTopK.stage2_select`,
`ddtree._second_stage_by_select`).

How: the threshold kernel of `chunk_topk` over a whole row (up to MAX_WIDTH entries, more warps).
The row's scores become int32 keys in the float total order (`order_key`: -0.0 below +0.0);
their m-th largest is built a few bits a round (32 / radix_bits rounds of compare-and-count);
every entry above it is kept, and among the entries equal to it the lowest positions. A prefix
count then places the kept positions in slots 0..m-1 by position. Exact for any input: ties of
score, signed zeros, -inf.

One program's radix rounds are latency-bound (~0.6 us a round), and at 16384 lanes its
[width, 4] counts spill: as a prefilter of the depths' selections it was slower than XLA's
pairwise rank.
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

__all__ = ["select_top", "select_top_reference", "IMPLS", "MAX_WIDTH"]

IMPLS = ("xla", "pallas", "pallas_interpret")
# Widest row one program holds (values in registers: 32 a thread on 16 warps).
MAX_WIDTH = 16384


def select_top_reference(scores: jax.Array, m: int) -> jax.Array:
    """XLA path: one sort by (score key desc, position asc), its first m positions, ascending.
    scores float [..., P]. Returns int32 [..., m]."""
    p = scores.shape[-1]
    pos = jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), scores.shape)
    # ~key: descending by the score key, as an ascending sort key
    first = lax.sort((~order_key(scores), pos), dimension=scores.ndim - 1, num_keys=2)[1][..., :m]
    return jnp.sort(first, axis=-1)


def _select_kernel(s_ref, pos_ref, *, p: int, width: int, m: int, m_pad: int, radix_bits: int):
    """One row: scores s_ref [P] -> pos_ref [m_pad], slots 0..m-1."""
    lane = jnp.arange(width, dtype=jnp.int32)
    valid = lane < p
    x = pltriton.load(s_ref.at[jnp.minimum(lane, p - 1)], mask=valid, other=-jnp.inf).astype(jnp.float32)
    key = order_key(x)
    take = take_by_position(key, valid, m, kth_largest(key, valid, m, radix_bits))  # ties: lowest positions
    slot = kept_slots(take, m, m_pad)
    pltriton.store(pos_ref.at[slot], lane, mask=take)


def _num_warps(width: int) -> int:
    # ~16-32 values a thread (chunk_topk's 2048-lane programs run 4 warps).
    return int(min(16, max(4, width // 512)))


def select_top(scores: jax.Array, m: int, *, impl: str = "pallas", radix_bits: int = 2,
               num_warps: int | None = None) -> jax.Array:
    """Positions of the m best entries of each row of scores [..., P] under (score desc in the
    float total order, -0.0 below +0.0; then the lower position first, lax.top_k's rule), in
    ascending position order: int32 [..., m].

    impl: "pallas" (one program a row), "pallas_interpret" (the same kernel on any backend, for
    tests) or "xla" (`select_top_reference`: a sort). radix_bits (1, 2 or 4) and num_warps do
    not change the result.
    """
    p = scores.shape[-1]
    if not 1 <= m <= p:
        raise ValueError(f"select_top: m={m} must be within 1..{p} (the row's length)")
    if impl == "xla":
        return select_top_reference(scores, m)
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
        m_pad += 1          # a spare slot for the masked-off lanes (see chunk_topk.kept_slots)
    warps = num_warps or _num_warps(width)
    params = None if interpret else pltriton.CompilerParams(num_warps=warps, num_stages=1)
    pos = pl.pallas_call(
        functools.partial(_select_kernel, p=p, width=width, m=m, m_pad=m_pad, radix_bits=radix_bits),
        grid=(rows,),
        in_specs=[pl.BlockSpec((None, p), lambda r: (r, 0))],
        out_specs=pl.BlockSpec((None, m_pad), lambda r: (r, 0)),
        out_shape=jax.ShapeDtypeStruct((rows, m_pad), jnp.int32),
        compiler_params=params,
        interpret=interpret,
        name="select_top",
    )(scores.reshape(rows, p))
    return pos[:, :m].reshape(*lead, m)
