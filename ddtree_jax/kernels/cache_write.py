"""Every layer's KV-cache write of a round in one kernel: the accepted path's rows, in place.

Why: the commit of a round writes the accepted path's K and V (at most D + 1 rows) into each
layer's cache: 72 arrays for the Qwen3-8B target. XLA makes one small in-place kernel of each
(a gather of the path rows fused into a dynamic-update-slice, ~1.5 us apiece on an H200, 74-84
cache-write kernels a round). Here one ``pallas_call`` takes all arrays,
aliases every cache to its output (nothing is copied: only the new rows are stored) and moves
the rows of all of them: a program per (batch row, kv head, layer), or per group of layers. The
caches may be stacked (every layer in one array: two buffers a call instead of 72, ~7.7 us of host
time saved per donated buffer).

Contract (as ``ddtree_jax.models.layers.append`` with ``rows``): each cache is one layer's
``[Bt, Hkv, S, Dh]`` or L layers stacked ``[L, Bt, Hkv, S, Dh]``; its layers are "slots", counted
across the caches in order (cache 0's layers, then cache 1's: the engine passes ``[k, v]`` stacked,
so the K layers come first). The new arrays are one ``[Bt, T, Hkv, Dh]`` a slot (a list) or all of
them stacked ``[Bt, T, n_slots, Hkv, Dh]`` (slot j at ``[:, :, j]``: the drafter's context K/V of
every layer from one product); row ``start[b] + p`` of batch row b in slot j gets slot j's new
entry ``rows[b, p]`` (p < P), cast to the cache dtype. The caches come back in the shapes given.
Writes reaching past S are outside the contract (the engine sizes its caches so that it never
makes them; XLA's path would move them back to fit, the kernel drops them). The models' "auto"
(ddtree_jax.kernels.dispatch) is the kernel on NVIDIA GPUs with a Triton lowering (on the H200
DDTree-64's 8B round went from 7.90 to 7.25 ms) and XLA's path elsewhere.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .norms import _pow2_at_least, pltriton

__all__ = ["write_cache_rows", "write_cache_rows_reference", "resolve_impl", "MAX_ROWS", "IMPLS"]

IMPLS = ("xla", "pallas", "triton", "pallas_interpret")
MAX_ROWS = 64      # path rows a program holds in one [rows, Dh] tile


def _stacked5(cache: jax.Array) -> jax.Array:
    """A cache as [L, Bt, Hkv, S, Dh] (a 4-D one as L = 1: a reshape, free)."""
    return cache if cache.ndim == 5 else cache.reshape(1, *cache.shape)


def _slots(caches) -> list[tuple[int, int]]:
    """(cache, layer) of every slot, in the order the new arrays come."""
    return [(i, layer) for i, c in enumerate(caches) for layer in range(c.shape[0] if c.ndim == 5 else 1)]


def _write_cache(cache: jax.Array, news: jax.Array, start: jax.Array, rows: jax.Array | None) -> jax.Array:
    """A [L, Bt, Hkv, S, Dh] cache with every layer's path rows written: one scatter of a
    [L, Hkv, P, Dh] window a batch row, at (0, b, 0, start[b], 0), into the big array itself.
    news: [Bt, T, L, Hkv, Dh], the cache's layers' new arrays. The layer axis is part of the
    window, never an index: an index would be a constant a layer, and XLA compiles each layer's
    write (a fusion with its own constants) as a kernel of its own (72 scatters in the 8B
    prefill, ~2x XLA:CPU's compile at 36 layers), where the per-layer arrays' identical writes
    were compiled once. A scatter, not vmap's dynamic-update-slice, which puts transposes around
    a cache batched on axis 1 (they would copy the whole cache). rows None: all of new's rows in
    order (a prompt; no gather, which XLA compiles slowly)."""
    picked = news if rows is None else jnp.take_along_axis(news, rows[:, :, None, None, None], axis=1)
    picked = jnp.transpose(picked, (0, 2, 3, 1, 4)).astype(cache.dtype)        # [Bt, L, Hkv, P, Dh]
    dims = lax.ScatterDimensionNumbers(
        update_window_dims=(1, 2, 3, 4), inserted_window_dims=(), scatter_dims_to_operand_dims=(3,),
        operand_batching_dims=(1,), scatter_indices_batching_dims=(0,))
    # CLIP: a window reaching past S moves back to fit, as dynamic-update-slice does
    return lax.scatter(cache, start[:, None], picked, dims, indices_are_sorted=True, unique_indices=True,
                       mode=lax.GatherScatterMode.CLIP)


def write_cache_rows_reference(caches, news, start, rows):
    """The XLA path: one scatter a cache array, every layer of it at once (its layers' gathers
    fused in). news: a list, one array a slot, or all slots stacked [Bt, T, n_slots, Hkv, Dh];
    rows None: every new row, in order (no gather)."""
    stacked = not isinstance(news, (list, tuple))
    out, j = [], 0
    for c in caches:
        c5 = _stacked5(c)
        n = c5.shape[0]
        mine = news[:, :, j:j + n] if stacked else jnp.stack(news[j:j + n], axis=2)
        out.append(_write_cache(c5, mine, start, rows).reshape(c.shape))
        j += n
    return out


def _kernel(*refs, slots: tuple[tuple[int, int], ...], n_caches: int, p: int, groups: int, stacked: bool):
    start_ref, rows_ref = refs[0], refs[1]
    n_news = 1 if stacked else len(slots)
    news = refs[2:2 + n_news]
    outs = refs[2 + n_news + n_caches:]     # the caches' outputs (aliased to the inputs), [L, S, Dh]
    t, dh = news[0].shape[0], news[0].shape[-1]
    s = outs[0].shape[1]
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
    for j, (i, layer) in enumerate(slots):
        def copy(j=j, out_ref=outs[i], layer=layer):
            vals = news[0][src, j, cols] if stacked else news[j][src, cols]   # [Pp, Dh] gather
            pltriton.store(out_ref.at[layer, dst, cols], vals.astype(out_ref.dtype), mask=ok)

        if groups == 1:
            copy()
        else:
            lax.cond(g == j % groups, copy, lambda: None)


def _write_pallas(caches, news, start, rows, *, interpret: bool, groups: int = 0):
    """The kernel; caches: 4-D or 5-D as the callers gave them, returned in their shapes.
    groups: programs per (batch row, kv head), each moving every groups-th slot (0: one a slot,
    the fastest: a program's slots go one after the other, a latency-bound gather and store each,
    and the 8B target's write took 2.8 us a round at one slot a program against 11.4 at nine)."""
    shapes = [c.shape for c in caches]
    slots = tuple(_slots(caches))
    caches = [_stacked5(c) for c in caches]
    _, bt, hkv, s, dh = caches[0].shape
    stacked = not isinstance(news, (list, tuple))
    news = [news] if stacked else list(news)
    t = news[0].shape[1]
    p = rows.shape[1]
    n = len(slots)
    groups = min(groups, n) if groups else n
    scalar = pl.BlockSpec((None,), lambda b, h, g: (b,))
    row_spec = pl.BlockSpec((None, p), lambda b, h, g: (b, 0))
    if stacked:
        new_spec = pl.BlockSpec((None, t, n, None, dh), lambda b, h, g: (b, 0, 0, h, 0))
    else:
        new_spec = pl.BlockSpec((None, t, None, dh), lambda b, h, g: (b, 0, h, 0))
    cache_specs = [pl.BlockSpec((c.shape[0], None, None, s, dh), lambda b, h, g: (0, b, h, 0, 0)) for c in caches]
    params = None if interpret else pltriton.CompilerParams(num_warps=1, num_stages=1)
    out = pl.pallas_call(
        functools.partial(_kernel, slots=slots, n_caches=len(caches), p=p, groups=groups, stacked=stacked),
        grid=(bt, hkv, groups),
        in_specs=[scalar, row_spec] + [new_spec] * len(news) + cache_specs,
        out_specs=cache_specs,
        out_shape=[jax.ShapeDtypeStruct(c.shape, c.dtype) for c in caches],
        input_output_aliases={2 + len(news) + i: i for i in range(len(caches))},
        compiler_params=params,
        interpret=interpret,
        name="kv_cache_write",
    )(start.astype(jnp.int32), rows.astype(jnp.int32), *news, *caches)
    return [o.reshape(shape) for o, shape in zip(out, shapes)]


def _unstacked(news, n: int) -> list[jax.Array]:
    """The new arrays as a list (a stacked [Bt, T, n, Hkv, Dh] array cut along axis 2)."""
    if isinstance(news, (list, tuple)):
        return list(news)
    if news.ndim != 5 or news.shape[2] != n:
        raise ValueError(f"stacked new arrays must be [Bt, T, {n}, Hkv, Dh] for {n} cache layers; got {news.shape}")
    return [news[:, :, j] for j in range(n)]


def _unsupported(caches, news, rows) -> str | None:
    if not caches:
        return "no arrays"
    layer = caches[0].shape[-4:]
    if any(c.shape[-4:] != layer for c in caches) or any(x.shape != news[0].shape for x in news):
        return "layers or new arrays of different shapes"
    dh = layer[-1]
    if dh & (dh - 1) or dh < 16:
        return f"head dim {dh} is not a power of two >= 16"
    if rows.shape[1] > MAX_ROWS or rows.shape[1] == 0:
        return f"{rows.shape[1]} rows a write (1..{MAX_ROWS})"
    return None


def resolve_impl(impl: str) -> str:
    """The path a write takes ("triton" is "pallas")."""
    if impl not in IMPLS:
        raise ValueError(f"unknown cache-write impl {impl!r}; choose one of {IMPLS} "
                         "(\"auto\" is chosen per device by ddtree_jax.kernels.dispatch)")
    return "pallas" if impl == "triton" else impl


def write_cache_rows(caches: list[jax.Array], news: "list[jax.Array] | jax.Array", start: jax.Array,
                     rows: jax.Array | None, *, impl: str = "xla", groups: int = 0) -> list[jax.Array]:
    """New caches with rows[b, p] of each slot's new array written at start[b] + p (see the
    module doc). caches: [Bt, Hkv, S, Dh] (one slot) or [L, Bt, Hkv, S, Dh] (L slots) each;
    news: one [Bt, T, Hkv, Dh] a slot, or [Bt, T, n_slots, Hkv, Dh]; start [Bt]; rows [Bt, P],
    or None: every new row, in order (XLA's path then gathers nothing).

    impl: "xla" | "pallas" (= "triton") | "pallas_interpret" (dispatch.write_cache_rows picks it
    per device: the kernel on NVIDIA GPUs);
    the Pallas impls take XLA's path for what the kernel cannot take (more than MAX_ROWS rows,
    layers of different shapes, odd head dims). groups: the kernel's programs per (batch row, kv
    head), each moving every groups-th slot; 0 (the default): one program a slot.
    """
    impl = resolve_impl(impl)
    for i, c in enumerate(caches):
        if c.ndim not in (4, 5):
            raise ValueError(f"cache {i} has shape {c.shape}: give [Bt, Hkv, S, Dh] or [L, Bt, Hkv, S, Dh]")
    n_slots = len(_slots(caches))
    if isinstance(news, (list, tuple)) and n_slots != len(news):
        raise ValueError(f"{n_slots} cache layers but {len(news)} new arrays: give one new array a layer")
    listed = _unstacked(news, n_slots)      # views for the checks
    if impl == "xla":
        return write_cache_rows_reference(caches, news, start, rows)
    kernel_rows = rows if rows is not None else \
        jnp.broadcast_to(jnp.arange(listed[0].shape[1], dtype=jnp.int32), listed[0].shape[:2])
    if _unsupported(caches, listed, kernel_rows):
        return write_cache_rows_reference(caches, news, start, rows)
    if impl == "pallas" and pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); use impl='xla'")
    if groups < 0:
        raise ValueError(f"groups={groups}: give a whole number (0: a program per slot)")
    return _write_pallas(caches, news, start, kernel_rows, interpret=impl == "pallas_interpret", groups=groups)
