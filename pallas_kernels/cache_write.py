"""Every layer's KV-cache write of a round in one kernel: the accepted path's rows, in place.

Why: the commit of a round writes the accepted path's K and V (at most D + 1 rows) into each
layer's cache: 72 arrays for the Qwen3-8B target. XLA makes one small in-place kernel of each
(a gather of the path rows fused into a dynamic-update-slice, ~1.5 us apiece on an H200, 74-84
cache-write kernels a round in session 2's profile). Here one ``pallas_call`` takes all arrays,
aliases every cache to its output (nothing is copied: only the new rows are stored) and moves
the rows of all of them: a program per (batch row, kv head, array), or per group of arrays.

Contract (as ``ddtree_jax.models.layers.append`` with ``rows``): caches ``[Bt, Hkv, S, Dh]``,
new ``[Bt, T, Hkv, Dh]`` (a list, one per cache) or all of them stacked ``[Bt, T, n, Hkv, Dh]``
(array j at ``[:, :, j]``: the drafter's context K/V of every layer from one product); cache row
``start[b] + p`` of batch row b gets new entry ``rows[b, p]`` (p < P), cast to the cache dtype.
Writes reaching past S are outside the contract (the engine sizes its caches so that it never
makes them; XLA's path would move them back to fit, the kernel drops them). ``impl="auto"`` is the
kernel on NVIDIA GPUs with a Triton lowering (measured on the H200, session 6: DDTree-64's 8B round
7.90 -> 7.25 ms, XLA's dots; bench/RESULTS.md) and XLA's path elsewhere.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["write_cache_rows", "write_cache_rows_reference", "resolve_impl", "MAX_ROWS"]

_IMPLS = ("auto", "xla", "pallas", "triton", "pallas_interpret")
MAX_ROWS = 64      # path rows a program holds in one [rows, Dh] tile


def _groups_setting() -> int:
    text = os.environ.get("DDTREE_CACHE_WRITE_GROUPS", "0")
    if not text.isdigit():
        raise ValueError(f"DDTREE_CACHE_WRITE_GROUPS={text!r}: give a whole number (0: a program per array)")
    return int(text)


# Programs per (batch row, kv head), each moving every GROUPS-th array (0: one program per array).
# A program's arrays go one after the other (a gather, then a store: latency-bound), so fewer
# arrays a program means more copies in flight. Session 6 shipped 8 (untimed); the H200 profiles
# since (sessions 10-12, DDTree-64) show the target's write at 11.4-11.7 us a round for 72 arrays
# of 16 rows (2.4 MB), 9 arrays a program; with one array a program 2.8 us (session 16's profile,
# 576 programs of one warp; bench/RESULTS.md).
# DDTREE_CACHE_WRITE_GROUPS=N in the environment sets it (for A/B timings).
GROUPS = _groups_setting()


def _write_one(cache: jax.Array, new: jax.Array, start: jax.Array, rows: jax.Array) -> jax.Array:
    picked = jnp.take_along_axis(new, rows[:, :, None, None], axis=1)          # [Bt, P, Hkv, Dh]
    picked = jnp.swapaxes(picked, 1, 2).astype(cache.dtype)
    return jax.vmap(lambda c, n, s: lax.dynamic_update_slice(c, n, (0, s, 0)))(cache, picked, start)


def write_cache_rows_reference(caches, news, start, rows):
    """The XLA path: one gather + dynamic-update-slice per array (what XLA fuses per array)."""
    return [_write_one(c, n, start, rows) for c, n in zip(caches, news)]


def _kernel(*refs, n_arrays: int, p: int, groups: int, stacked: bool):
    start_ref, rows_ref = refs[0], refs[1]
    n_news = 1 if stacked else n_arrays
    news = refs[2:2 + n_news]
    outs = refs[2 + n_news + n_arrays:]     # the caches' outputs (aliased to the caches' inputs)
    t, dh = news[0].shape[0], news[0].shape[-1]
    s = outs[0].shape[0]
    pp = _pow2_at_least(p)
    offs = jnp.arange(pp, dtype=jnp.int32)
    src = rows_ref[jnp.minimum(offs, p - 1)]
    src = jnp.clip(src, 0, t - 1)[:, None]
    dst = start_ref[()] + offs
    ok = (offs < p) & (dst < s)
    # Masked lanes store nothing on a GPU; interpret mode writes their old value back, so they
    # point at a row no valid lane writes (the one after the write, wrapped), never at a clamped
    # duplicate of a valid lane's row.
    dst = jnp.where(ok, dst, lax.rem(start_ref[()] + p, s))[:, None]
    ok = ok[:, None]
    cols = jnp.arange(dh, dtype=jnp.int32)[None, :]
    g = pl.program_id(2)
    for j in range(n_arrays):
        def copy(j=j, out_ref=outs[j]):
            vals = news[0][src, j, cols] if stacked else news[j][src, cols]   # [Pp, Dh] gather
            pltriton.store(out_ref.at[dst, cols], vals.astype(out_ref.dtype), mask=ok)

        if groups == 1:
            copy()
        else:
            lax.cond(g == j % groups, copy, lambda: None)


def _write_pallas(caches, news, start, rows, *, interpret: bool):
    bt, hkv, s, dh = caches[0].shape
    stacked = not isinstance(news, (list, tuple))
    news = [news] if stacked else list(news)
    t = news[0].shape[1]
    p = rows.shape[1]
    n = len(caches)
    groups = min(GROUPS, n) if GROUPS else n
    scalar = pl.BlockSpec((None,), lambda b, h, g: (b,))
    row_spec = pl.BlockSpec((None, p), lambda b, h, g: (b, 0))
    if stacked:
        new_spec = pl.BlockSpec((None, t, n, None, dh), lambda b, h, g: (b, 0, 0, h, 0))
    else:
        new_spec = pl.BlockSpec((None, t, None, dh), lambda b, h, g: (b, 0, h, 0))
    cache_spec = pl.BlockSpec((None, None, s, dh), lambda b, h, g: (b, h, 0, 0))
    params = None if interpret else pltriton.CompilerParams(num_warps=1, num_stages=1)
    return pl.pallas_call(
        functools.partial(_kernel, n_arrays=n, p=p, groups=groups, stacked=stacked),
        grid=(bt, hkv, groups),
        in_specs=[scalar, row_spec] + [new_spec] * len(news) + [cache_spec] * n,
        out_specs=[cache_spec] * n,
        out_shape=[jax.ShapeDtypeStruct(c.shape, c.dtype) for c in caches],
        input_output_aliases={2 + len(news) + j: j for j in range(n)},
        compiler_params=params,
        interpret=interpret,
        name="kv_cache_write",
    )(start.astype(jnp.int32), rows.astype(jnp.int32), *news, *caches)


def _unstacked(news, n: int) -> list[jax.Array]:
    """The new arrays as a list (a stacked [Bt, T, n, Hkv, Dh] array cut along axis 2)."""
    if isinstance(news, (list, tuple)):
        return list(news)
    if news.ndim != 5 or news.shape[2] != n:
        raise ValueError(f"stacked new arrays must be [Bt, T, {n}, Hkv, Dh] for {n} caches; got {news.shape}")
    return [news[:, :, j] for j in range(n)]


def _unsupported(caches, news, rows) -> str | None:
    if not caches:
        return "no arrays"
    shape = caches[0].shape
    if any(c.shape != shape for c in caches) or any(x.shape != news[0].shape for x in news):
        return "arrays of different shapes"
    dh = shape[-1]
    if dh & (dh - 1) or dh < 16:
        return f"head dim {dh} is not a power of two >= 16"
    if rows.shape[1] > MAX_ROWS or rows.shape[1] == 0:
        return f"{rows.shape[1]} rows a write (1..{MAX_ROWS})"
    return None


def resolve_impl(impl: str) -> str:
    """The path a write takes: "auto" is "pallas" where the attention kernels' auto is (NVIDIA
    GPUs with a Triton lowering), "xla" elsewhere; "triton" is "pallas"."""
    if impl not in _IMPLS:
        raise ValueError(f"unknown cache-write impl {impl!r}; choose one of {_IMPLS}")
    if impl == "auto":
        from .tree_attention import auto_impl
        return "pallas" if auto_impl() == "pallas" else "xla"
    return "pallas" if impl == "triton" else impl


def write_cache_rows(caches: list[jax.Array], news: "list[jax.Array] | jax.Array", start: jax.Array,
                     rows: jax.Array, *, impl: str = "auto") -> list[jax.Array]:
    """New caches with rows[b, p] of each new array written at start[b] + p (see the module doc).

    impl: "auto" (resolve_impl: the kernel on NVIDIA GPUs) | "xla" | "pallas" (= "triton") |
    "pallas_interpret";
    the Pallas impls take XLA's path for what the kernel cannot take (more than MAX_ROWS rows,
    arrays of different shapes, odd head dims).
    """
    impl = resolve_impl(impl)
    if isinstance(news, (list, tuple)) and len(caches) != len(news):
        raise ValueError(f"{len(caches)} caches but {len(news)} new arrays")
    listed = _unstacked(news, len(caches))      # views for the checks and XLA's path
    if impl == "xla" or _unsupported(caches, listed, rows):
        return write_cache_rows_reference(caches, listed, start, rows)
    if impl == "pallas" and pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); use impl='xla'")
    return list(_write_pallas(caches, news, start, rows, interpret=impl == "pallas_interpret"))
