"""The Mosaic GPU attention's key-share merge as one Pallas Triton kernel.

With ``key_splits`` (and the tail split's second launch) the Mosaic GPU kernel
(tree_attention_mgpu.py) writes N partial outputs, each normalised over its share of the keys,
and each row's log2-sum-exp2; ``tree_attention_mgpu.merge_splits`` combines them in XLA, which
on the H200 makes two fusions: the weights' exponentials, then the weighted sum (1.2 + 1.6 us a
layer at DDTree-64's 72 rows, plus the gap between them). This kernel does both in one launch:
each program takes a block of query heads of one token of one batch row, loads every share's
log2-sum-exp2 for them once (from the kernel's folded row order) and their partials ``[shares,
heads, Dh]``, and stores the merged ``[heads, Dh]``: 1.74 us at T = 72, so DDTree-64's default
config (ONE_WAVE_CONFIGS[72]) takes it. At T = 264's tail split XLA's single slice fusion is
faster (1.3 against 1.9 us), so that keeps XLA's. Selected by the config's ``m``
(MgpuConfig.merge_kernel); a CPU path through ``interpret=True``. (A version that gathered the
log2-sum-exp2 once per column, with half the programs, took 4.3 us.)
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

try:  # The Triton lowering is deprecated in jax 0.11 and may disappear later.
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover - depends on the installed jax
    pl = pltriton = None

MERGE_WIDTH = 1024    # output columns a program at most: a power-of-two block of heads x Dh


def _kernel(lse_ref, parts_ref, out_ref, *, splits: int, bt: int, hq: int, g: int, dh: int, rows: int,
            block_m: int, heads: int):
    """Program (i, b): query heads [hb * heads, (hb + 1) * heads) of token i // n_hb (hb = i % n_hb)
    of batch row b. lse_ref [N * Bt, Hkv * rows] float32; parts_ref [N * Bt, T * Hq * Dh];
    out_ref [Bt, T * Hq * Dh]. Each (share, head) weight is computed once and broadcast over Dh."""
    b = pl.program_id(1)
    n_hb = pl.cdiv(hq, heads)
    tok = lax.div(pl.program_id(0), n_hb)
    head = lax.rem(pl.program_id(0), n_hb) * heads + jnp.arange(heads, dtype=jnp.int32)      # [H]
    headc = jnp.minimum(head, hq - 1)                                                      # reads in range
    tb = block_m // g
    # Token m * TB + tl of head h * G + gi is folded row gi * TB + tl of row block m.
    lrow = lax.div(headc, g) * rows + lax.div(tok, tb) * block_m + lax.rem(headc, g) * tb + lax.rem(tok, tb)
    share = jnp.arange(pl.next_power_of_2(splits), dtype=jnp.int32)
    real = share < splits
    prow = jnp.minimum(share, splits - 1) * bt + b                                          # [P]
    lse = pltriton.load(lse_ref.at[prow[:, None], lrow[None, :]], mask=real[:, None], other=-jnp.inf)  # [P, H]
    d = jnp.arange(dh, dtype=jnp.int32)[None, :]
    col = (tok * hq + headc)[:, None] * dh + d                                             # [H, Dh]
    part = pltriton.load(parts_ref.at[prow[:, None, None], col[None, :, :]], mask=real[:, None, None],
                         other=0.0).astype(jnp.float32)                                      # [P, H, Dh]
    # A share that saw no key has -1e30 (weight 0 beside any share that did); the padding
    # shares -inf (weight 0 always).
    w = jnp.exp2(lse - lse.max(axis=0)[None, :])
    den = w.sum(axis=0)
    out = (w[:, :, None] * part).sum(axis=0) / jnp.where(den > 0.0, den, 1.0)[:, None]
    # stored at the unclamped heads: masked lanes must not share an address with a real one (in
    # interpret mode a masked store writes the old value back, and duplicates race)
    dst = (tok * hq + head)[:, None] * dh + d
    pltriton.store(out_ref.at[b, dst], out.astype(out_ref.dtype), mask=(head < hq)[:, None])


def merge_splits_kernel(parts, lse, *, splits: int, g: int, block_m: int, interpret: bool = False):
    """Same contract as tree_attention_mgpu.merge_splits, in one Pallas Triton kernel: parts
    [N * Bt, T, Hq, Dh] (share c's rows at c * Bt + b), lse float32 [N * Bt, Hkv, rows] in the
    kernel's folded row order (row blocks of `block_m` folded rows: tree_attention_mgpu.BLOCK_M).
    Returns [Bt, T, Hq, Dh] in parts' dtype."""
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); "
                           "use the XLA merge (a config without m)")
    nb, t, hq, dh = parts.shape
    bt, hkv, rows = nb // splits, lse.shape[1], lse.shape[2]
    n_cols = t * hq * dh
    if dh & (dh - 1):
        raise ValueError(f"the merge kernel needs a power-of-two head dim (got {dh}); use the XLA merge")
    heads = min(max(1, MERGE_WIDTH // dh), pl.next_power_of_2(hq))
    kernel = functools.partial(_kernel, splits=splits, bt=bt, hq=hq, g=g, dh=dh, rows=rows,
                               block_m=block_m, heads=heads)
    out = pl.pallas_call(
        kernel,
        grid=(t * pl.cdiv(hq, heads), bt),
        in_specs=[pl.BlockSpec((nb, hkv * rows), lambda k, b: (0, 0)),
                  pl.BlockSpec((nb, n_cols), lambda k, b: (0, 0))],
        out_specs=pl.BlockSpec((bt, n_cols), lambda k, b: (0, 0)),
        out_shape=jax.ShapeDtypeStruct((bt, n_cols), parts.dtype),
        compiler_params=None if interpret else pltriton.CompilerParams(num_warps=4, num_stages=1),
        interpret=interpret,
        name="ddtree_split_merge",
    )(lse.reshape(nb, hkv * rows), parts.reshape(nb, n_cols))
    return out.reshape(bt, t, hq, dh)
