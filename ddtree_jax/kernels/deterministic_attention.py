"""Tree attention whose every row is bit for bit what a one-row decode step computes.

The deterministic mode's attention (ddtree_jax.kernels.dispatch, KernelTuning.deterministic). A
verify row of a token at depth d over a cache of L positions sees the prefix and its d
ancestors as new keys; the one-row decode step of the same token, after its ancestors were
committed, sees a cache of L + d positions. Both must fold the same keys in the same order.

Canonical order: a row's keys form one sequence, the cache's positions [kv_start, cache_len)
followed by the new keys it may see in index order (a tree lists parents before children, so
its ancestors come in depth order: sequence index = position). The sequence is cut into blocks
of ``block_k`` at fixed indices (block j holds indices [j * block_k, (j + 1) * block_k)), and the
blocks into chunks of ``chunk_k`` keys, also at fixed indices (the ``max_chunks``-th takes the
rest of the sequence, whatever its length: it bounds the chunks' memory). A program folds one
chunk's blocks in order with an online softmax through one code path (`fold`, and the same ops
around it), every lane at the same place whether the key came from the cache or from the new
keys; a second kernel (`_merge_kernel`) merges a row's chunks in index order. Nothing is split by the
row count: the chunks are the sequence's, one row tile (``block_m``) for every T, T = 1 included.

A program holds ``block_m`` folded rows (tree token r // G, query head r % G of one kv head):

* shared blocks, [0, cache_len // block_k): every row's keys are the cache's, one K/V tile;
* tail blocks, from there to the row's last key: per token of the program, a K/V tile of its
  own (lane i: cache[i] below cache_len, else the token's (i - cache_len)-th visible new key,
  from a table made once a forward by XLA), folded into that token's rows alone.

A decode step folds as shared some blocks that a verify folds as tail: the same values in the
same lanes through the same `fold`, so the same bits. What a GPU needs of it: one MMA
instruction shape for every call (block_m, block_k, num_warps fixed; a row's products do not
depend on the other rows of its tile), which `DeterministicConfig` fixes. Cost: the tail
re-reads a short stretch of cache and the ancestors per token; the chunks give a decode step at
batch 1 one program a kv head and chunk (not one a kv head), and the merge reads each row's
chunk folds once more (float32 [Dh] and two numbers a row and chunk).

Backend: Pallas with the Triton lowering, interpret mode on the CPU (as tree_attention.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .attention_reference import check_attention_shapes
from .stacking import as_stack, clamp_layer, layer_index
from .tree_attention import _compiler_params, _kernel_precision, pltriton, unsupported

__all__ = ["DeterministicConfig", "deterministic_attention", "visible_keys"]

_LOG2E = math.log2(math.e)
_NEG = -1e30   # finite "minus infinity": keeps max/exp free of inf - inf


@dataclasses.dataclass(frozen=True)
class DeterministicConfig:
    """The kernel's tiles: one config for every row count (a row tile or key step that followed
    T would change the MMA instruction or the fold order)."""
    block_m: int = 64       # folded rows a program (64: one Hopper warpgroup MMA's M)
    block_k: int = 64       # keys a fold step, at fixed sequence indices
    chunk_k: int = 256      # keys a program folds, at fixed sequence indices; the chunks merge in order
    max_chunks: int = 16    # the last chunk takes every key past (max_chunks - 1) * chunk_k: the parts' memory
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.chunk_k < self.block_k or self.chunk_k % self.block_k or self.max_chunks < 1:
            raise ValueError(f"DeterministicConfig: chunk_k {self.chunk_k} must be a multiple of block_k "
                             f"{self.block_k}, and max_chunks {self.max_chunks} at least 1")


def visible_keys(new_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(counts int32 [Bt, T], order int32 [Bt, T, T]) of new_mask [Bt, T, T]: how many new keys
    each row sees, and their indices in ascending order first (the rest after). XLA ops on
    new_mask alone, so a forward's layers share them (CSE)."""
    counts = new_mask.sum(axis=-1, dtype=jnp.int32)
    order = jnp.argsort(~new_mask, axis=-1, stable=True).astype(jnp.int32)
    return counts, order


def _tokens_per_block(block_m: int, g: int) -> int:
    """Most tokens whose rows meet in one row block of block_m folded rows."""
    return block_m // g if block_m % g == 0 else (block_m - 1) // g + 2


def _kernel(*refs, scale: float, t: int, g: int, block_m: int, block_k: int, chunk_k: int, max_chunks: int, seq: int,
            precision, has_prefix: bool, has_window: bool, n_layers: int):
    """One (row block, batch row, kv head, key chunk). Refs (some only with their flag): kv_start
    [] (has_window), cache_len [] and layer [] (has_prefix), q [T, G, Dh], k_cache and v_cache
    [L * Bt, S, Dh] (has_prefix), k_new and v_new [T, Dh], counts [T], order [T, T]; out the
    chunk's fold of each folded row: acc [T * G, Dh], max and sum [T * G] (`_merge_kernel`'s parts)."""
    refs = list(refs)
    lo_ref = refs.pop(0) if has_window else None
    len_ref, layer_ref = (refs.pop(0), refs.pop(0)) if has_prefix else (None, None)
    q_ref = refs.pop(0)
    k_ref, v_ref = (refs.pop(0), refs.pop(0)) if has_prefix else (None, None)
    kn_ref, vn_ref, count_ref, order_ref, acc_ref, max_ref, sum_ref = refs

    dh = q_ref.shape[-1]
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)
    tq, gq = (rows, jnp.zeros_like(rows)) if g == 1 else (lax.div(rows, g), lax.rem(rows, g))
    tc = jnp.minimum(tq, t - 1)          # padded rows repeat the last token: finite, not stored
    cols = jnp.arange(dh, dtype=jnp.int32)[None, :]
    q = q_ref[tc[:, None], gq[:, None], cols]                                 # [BM, Dh]
    qk_scale = scale * _LOG2E
    lanes = jnp.arange(block_k, dtype=jnp.int32)

    def fold(carry, k, v, ok):
        """Fold one block: keys k, values v [BK, Dh], ok [BM, BK] the (row, lane) pairs that count.
        The one code path of every block, shared or tail, so that a lane's arithmetic is the same."""
        acc, m_i, l_i = carry
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=jnp.float32)
        s = jnp.where(ok, s, _NEG)
        m_new = jnp.maximum(m_i, s.max(axis=1) * qk_scale)
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.where(ok, jnp.exp2(s * qk_scale - m_new[:, None]), 0.0)
        l_new = alpha * l_i + p.sum(axis=1)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)
        return alpha[:, None] * acc + pv, m_new, l_new

    carry = (jnp.zeros((block_m, dh), jnp.float32), jnp.full((block_m,), _NEG, jnp.float32),
             jnp.zeros((block_m,), jnp.float32))
    lo = jnp.maximum(lo_ref[()], 0) if has_window else jnp.int32(0)
    length = jnp.minimum(len_ref[()], seq) if has_prefix else jnp.int32(0)
    # this program's cache row: batch row b of the layer read at run time, clamped into the stack
    crow = clamp_layer(layer_ref[()], n_layers) * pl.num_programs(1) + pl.program_id(1) if has_prefix else None

    def block(j, tok_c, count):
        """Block j's keys and values [BK, Dh] for the token tok_c that sees `count` new keys, and
        which lanes hold one: lane i the cache's position i below cache_len, else the token's
        (i - cache_len)-th visible new key."""
        idx = j * block_k + lanes
        in_new = (idx >= length) & (idx - length < count)
        slot = order_ref[tok_c, jnp.clip(idx - length, 0, t - 1)]              # [BK] new-key indices
        k = pltriton.load(kn_ref.at[slot[:, None], cols], mask=in_new[:, None], other=0.0)
        v = pltriton.load(vn_ref.at[slot[:, None], cols], mask=in_new[:, None], other=0.0)
        if not has_prefix:
            return k, v, in_new
        in_cache = (idx < length) & (idx >= lo)
        pos = jnp.clip(idx, 0, seq - 1)[:, None]
        k = jnp.where(in_cache[:, None], pltriton.load(k_ref.at[crow, pos, cols], mask=in_cache[:, None], other=0.0), k)
        v = jnp.where(in_cache[:, None], pltriton.load(v_ref.at[crow, pos, cols], mask=in_cache[:, None], other=0.0), v)
        return k, v, in_new | in_cache

    def step(carry, k, v, seen, take):
        """Fold keys k, values v [BK, Dh] (lanes `seen` [BK] hold one) into the rows `take` [BM];
        the others keep their carry. Shared and tail blocks alike: XLA:CPU, in interpret mode,
        orders a fold's sums by the ops fused around it, so those are the same ops too."""
        new = fold(carry, k, v, take[:, None] & seen[None, :])
        return tuple(jnp.where(take[:, None] if n.ndim == 2 else take, n, c) for n, c in zip(new, carry))

    # this program's key chunk: blocks [first_block, end_block) of the sequence (the last chunk: all the rest)
    chunk = pl.program_id(3)
    first_block = chunk * (chunk_k // block_k)
    end_block = jnp.where(chunk == max_chunks - 1, pl.cdiv(seq + t, block_k), first_block + chunk_k // block_k)
    if has_prefix and seq >= block_k:      # a shorter cache has no whole block: its keys are all tail
        every = tq >= 0

        def shared_step(j, carry):
            start = pl.multiple_of(j * block_k, block_k)
            k = k_ref[crow, pl.ds(start, block_k), :]     # below cache_len <= S: in range, contiguous
            v = v_ref[crow, pl.ds(start, block_k), :]
            return step(carry, k, v, start + lanes >= lo, every)

        carry = lax.fori_loop(jnp.maximum(lax.div(lo, block_k), first_block),
                              jnp.minimum(lax.div(length, block_k), end_block), shared_step, carry)

    first_tail = jnp.maximum(lax.div(length, block_k), lax.div(lo, block_k))
    tok0 = lax.div(pl.program_id(0) * block_m, g)

    def tail_token(i, carry):
        """Fold the tail blocks of the block's i-th token into that token's rows."""
        tok = tok0 + i
        tok_c = jnp.minimum(tok, t - 1)
        take = (tq == tok) & (tok < t)                                       # [BM]
        count = count_ref[tok_c]
        end = jnp.where(tok < t, lax.div(length + count + (block_k - 1), block_k), first_tail)
        return lax.fori_loop(jnp.maximum(first_tail, first_block), jnp.minimum(end, end_block),
                             lambda j, c: step(c, *block(j, tok_c, count), take), carry)

    carry = lax.fori_loop(0, _tokens_per_block(block_m, g), tail_token, carry)

    acc, m_i, l_i = carry
    real = rows < t * g
    pltriton.store(acc_ref.at[rows[:, None], cols], acc, mask=real[:, None])
    pltriton.store(max_ref.at[rows], m_i, mask=real)
    pltriton.store(sum_ref.at[rows], l_i, mask=real)


def _merge_kernel(acc_ref, max_ref, sum_ref, o_ref, *, t: int, g: int, block_m: int, chunks: int):
    """One (row block, batch row, kv head): the chunks' folds of its rows merged one after another
    from the empty fold (a chunk past a row's keys is one too, and merges as an exact no-op: a
    decode step, whose grid has fewer chunks, merges the same bits), then normalised. Refs: the
    parts acc [C, T * G, Dh], max and sum [C, T * G]; out o [T, G, Dh]."""
    dh = o_ref.shape[-1]
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)
    real = rows < t * g
    cols = jnp.arange(dh, dtype=jnp.int32)[None, :]

    def merge(c, carry):
        acc, m_i, l_i = carry
        acc_c = pltriton.load(acc_ref.at[c, rows[:, None], cols], mask=real[:, None], other=0.0)
        m_c = pltriton.load(max_ref.at[c, rows], mask=real, other=_NEG)
        l_c = pltriton.load(sum_ref.at[c, rows], mask=real, other=0.0)
        m_new = jnp.maximum(m_i, m_c)
        a, b = jnp.exp2(m_i - m_new), jnp.exp2(m_c - m_new)
        return a[:, None] * acc + b[:, None] * acc_c, m_new, a * l_i + b * l_c

    carry = (jnp.zeros((block_m, dh), jnp.float32), jnp.full((block_m,), _NEG, jnp.float32),
             jnp.zeros((block_m,), jnp.float32))
    acc, _, l_i = lax.fori_loop(0, chunks, merge, carry)
    o = acc / jnp.where(l_i > 0.0, l_i, 1.0)[:, None]
    tq, gq = (rows, jnp.zeros_like(rows)) if g == 1 else (lax.div(rows, g), lax.rem(rows, g))
    pltriton.store(o_ref.at[tq[:, None], gq[:, None], cols], o.astype(o_ref.dtype), mask=real[:, None])


def deterministic_attention(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
                            kv_start=None, layer=None, interpret: bool = False,
                            config: DeterministicConfig | None = None):
    """ddtree_jax.kernels.tree_attention.attention's contract (any mask), each row folded in the
    canonical order of the module doc: one kernel a call."""
    bt, t, hq, hkv, dh, s, g = check_attention_shapes(
        q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer)
    why = unsupported(q, k_cache)
    if why:
        raise ValueError(f"the deterministic attention kernel cannot take these shapes: {why}")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); "
                           "the deterministic mode needs it")
    cfg = config or DeterministicConfig()
    counts, order = visible_keys(new_mask)
    layer, k_cache, v_cache = as_stack(layer, k_cache, v_cache)
    n_layers = k_cache.shape[0]
    k_cache = k_cache.reshape(n_layers * bt, hkv, s, dh)
    v_cache = v_cache.reshape(n_layers * bt, hkv, s, dh)
    q5 = q.reshape(bt, t, hkv, g, dh)                     # free: head h*G + j -> (h, j)
    has_prefix, has_window = s > 0, kv_start is not None
    rows = t * g
    chunks = min(pl.cdiv(s + t, cfg.chunk_k), cfg.max_chunks)   # the last key's sequence index is below S + T
    kernel = functools.partial(
        _kernel, scale=scale, t=t, g=g, block_m=cfg.block_m, block_k=cfg.block_k, chunk_k=cfg.chunk_k,
        max_chunks=cfg.max_chunks, seq=s,
        precision=_kernel_precision(q.dtype, interpret), has_prefix=has_prefix, has_window=has_window,
        n_layers=n_layers)
    scalar = pl.BlockSpec((None,), lambda m, b, h, c: (b,))
    per_head = pl.BlockSpec((None, t, None, g, dh), lambda m, b, h, c: (b, 0, h, 0, 0))
    args, specs = [], []
    if has_window:
        args.append(kv_start.astype(jnp.int32))
        specs.append(scalar)
    if has_prefix:
        args += [cache_len.astype(jnp.int32), layer_index(layer)]
        specs += [scalar, pl.BlockSpec((None,), lambda m, b, h, c: (0,))]
    args.append(q5)
    specs.append(per_head)
    if has_prefix:
        cache_rows = pl.BlockSpec((n_layers * bt, None, s, dh), lambda m, b, h, c: (0, h, 0, 0))
        args += [k_cache, v_cache]
        specs += [cache_rows, cache_rows]
    new_kv = pl.BlockSpec((None, t, None, dh), lambda m, b, h, c: (b, 0, h, 0))
    args += [k_new, v_new, counts, order]
    specs += [new_kv, new_kv, pl.BlockSpec((None, t), lambda m, b, h, c: (b, 0)),
              pl.BlockSpec((None, t, t), lambda m, b, h, c: (b, 0, 0))]
    # the parts: [Bt, Hkv, C, T * G (, Dh)] float32, a chunk's fold of every folded row
    part_shapes = [(bt, hkv, chunks, rows, dh), (bt, hkv, chunks, rows), (bt, hkv, chunks, rows)]
    row_blocks = pl.cdiv(rows, cfg.block_m)
    parts = pl.pallas_call(
        kernel,
        grid=(row_blocks, bt, hkv, chunks),
        in_specs=specs,
        out_specs=[pl.BlockSpec((None, None, None, rows, dh), lambda m, b, h, c: (b, h, c, 0, 0))]
                  + [pl.BlockSpec((None, None, None, rows), lambda m, b, h, c: (b, h, c, 0))] * 2,
        out_shape=[jax.ShapeDtypeStruct(shape, jnp.float32) for shape in part_shapes],
        compiler_params=_compiler_params(cfg.num_warps, cfg.num_stages, interpret),
        interpret=interpret,
        name="ddtree_attention_deterministic",
    )(*args)
    out = pl.pallas_call(
        functools.partial(_merge_kernel, t=t, g=g, block_m=cfg.block_m, chunks=chunks),
        grid=(row_blocks, bt, hkv),
        in_specs=[pl.BlockSpec((None, None, chunks, rows, dh), lambda m, b, h: (b, h, 0, 0, 0))]
                 + [pl.BlockSpec((None, None, chunks, rows), lambda m, b, h: (b, h, 0, 0))] * 2,
        out_specs=pl.BlockSpec((None, t, None, g, dh), lambda m, b, h: (b, 0, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct(q5.shape, q.dtype),
        compiler_params=_compiler_params(cfg.num_warps, 1, interpret),
        interpret=interpret,
        name="ddtree_attention_deterministic_merge",
    )(*parts)
    return out.reshape(bt, t, hq, dh)
