"""Every layer's KV-cache write of a round in one kernel: the accepted path's rows, in place.

Why: the commit of a round writes the accepted path's K and V (at most D + 1 rows) into each
layer's cache: 72 arrays for the Qwen3-8B target. XLA makes one small in-place kernel of each
(a gather of the path rows fused into a dynamic-update-slice, ~1.5 us apiece on an H200, 74-84
cache-write kernels a round in session 2's profile). Here one ``pallas_call`` takes all arrays,
aliases every cache to its output (nothing is copied: only the new rows are stored) and moves
the rows of all of them: a program per (batch row, kv head, group of arrays).

Contract (as ``ddtree_jax.models.layers.append`` with ``rows``): caches ``[Bt, Hkv, S, Dh]``,
new ``[Bt, T, Hkv, Dh]``; cache row ``start[b] + p`` of batch row b gets new entry
``rows[b, p]`` (p < P), cast to the cache dtype. Writes reaching past S are outside the contract
(the engine sizes its caches so that it never makes them; XLA's path would move them back to
fit, the kernel drops them). ``impl="auto"`` is the kernel on NVIDIA GPUs with a Triton lowering
(measured on the H200, session 6: DDTree-64's 8B round 7.90 -> 7.25 ms, XLA's dots; bench/RESULTS.md)
and XLA's path elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["write_cache_rows", "write_cache_rows_reference", "resolve_impl", "MAX_ROWS"]

_IMPLS = ("auto", "xla", "pallas", "triton", "pallas_interpret")
MAX_ROWS = 64      # path rows a program holds in one [rows, Dh] tile
_GROUPS = 8        # programs per (batch row, kv head), each taking every 8th array


def _write_one(cache: jax.Array, new: jax.Array, start: jax.Array, rows: jax.Array) -> jax.Array:
    picked = jnp.take_along_axis(new, rows[:, :, None, None], axis=1)          # [Bt, P, Hkv, Dh]
    picked = jnp.swapaxes(picked, 1, 2).astype(cache.dtype)
    return jax.vmap(lambda c, n, s: lax.dynamic_update_slice(c, n, (0, s, 0)))(cache, picked, start)


def write_cache_rows_reference(caches, news, start, rows):
    """The XLA path: one gather + dynamic-update-slice per array (what XLA fuses per array)."""
    return [_write_one(c, n, start, rows) for c, n in zip(caches, news)]


def _kernel(*refs, n_arrays: int, p: int, groups: int):
    start_ref, rows_ref = refs[0], refs[1]
    news = refs[2:2 + n_arrays]
    outs = refs[2 + 2 * n_arrays:]          # the caches' outputs (aliased to refs[2 + n_arrays:])
    t, dh = news[0].shape
    s = outs[0].shape[0]
    pp = _pow2_at_least(p)
    offs = jnp.arange(pp, dtype=jnp.int32)
    src = rows_ref[jnp.minimum(offs, p - 1)]
    src = jnp.clip(src, 0, t - 1)[:, None]
    dst = start_ref[()] + offs
    ok = ((offs < p) & (dst < s))[:, None]
    dst = jnp.minimum(dst, s - 1)[:, None]
    cols = jnp.arange(dh, dtype=jnp.int32)[None, :]
    g = pl.program_id(2)
    for j in range(n_arrays):
        def copy(new_ref=news[j], out_ref=outs[j]):
            vals = new_ref[src, cols]                                          # [Pp, Dh] gather
            pltriton.store(out_ref.at[dst, cols], vals.astype(out_ref.dtype), mask=ok)

        if groups == 1:
            copy()
        else:
            lax.cond(g == j % groups, copy, lambda: None)


def _write_pallas(caches, news, start, rows, *, interpret: bool):
    bt, hkv, s, dh = caches[0].shape
    t = news[0].shape[1]
    p = rows.shape[1]
    n = len(caches)
    groups = min(_GROUPS, n)
    scalar = pl.BlockSpec((None,), lambda b, h, g: (b,))
    row_spec = pl.BlockSpec((None, p), lambda b, h, g: (b, 0))
    new_spec = pl.BlockSpec((None, t, None, dh), lambda b, h, g: (b, 0, h, 0))
    cache_spec = pl.BlockSpec((None, None, s, dh), lambda b, h, g: (b, h, 0, 0))
    params = None if interpret else pltriton.CompilerParams(num_warps=1, num_stages=1)
    return pl.pallas_call(
        functools.partial(_kernel, n_arrays=n, p=p, groups=groups),
        grid=(bt, hkv, groups),
        in_specs=[scalar, row_spec] + [new_spec] * n + [cache_spec] * n,
        out_specs=[cache_spec] * n,
        out_shape=[jax.ShapeDtypeStruct(c.shape, c.dtype) for c in caches],
        input_output_aliases={2 + n + j: j for j in range(n)},
        compiler_params=params,
        interpret=interpret,
        name="kv_cache_write",
    )(start.astype(jnp.int32), rows.astype(jnp.int32), *news, *caches)


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


def write_cache_rows(caches: list[jax.Array], news: list[jax.Array], start: jax.Array, rows: jax.Array, *,
                     impl: str = "auto") -> list[jax.Array]:
    """New caches with rows[b, p] of each new array written at start[b] + p (see the module doc).

    impl: "auto" (resolve_impl: the kernel on NVIDIA GPUs) | "xla" | "pallas" (= "triton") |
    "pallas_interpret";
    the Pallas impls take XLA's path for what the kernel cannot take (more than MAX_ROWS rows,
    arrays of different shapes, odd head dims).
    """
    impl = resolve_impl(impl)
    if len(caches) != len(news):
        raise ValueError(f"{len(caches)} caches but {len(news)} new arrays")
    if impl == "xla" or _unsupported(caches, news, rows):
        return write_cache_rows_reference(caches, news, start, rows)
    if impl == "pallas" and pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); use impl='xla'")
    return list(_write_pallas(caches, news, start, rows, interpret=impl == "pallas_interpret"))
