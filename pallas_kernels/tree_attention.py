"""Verify / decode / drafter-block attention: a split-K Pallas kernel over the prefix.

Verify attention is memory-bound at small T (few queries, long prefix), so the prefix is split
across programs (flash-decoding). One program owns (query-row block, prefix chunk, batch row,
kv head): it walks its chunk in ``block_k`` steps with an online softmax and writes a normalised
partial output plus its log-sum-exp. All ``G * T`` query rows that share a kv head are folded
into the row dimension, so a handful of tree tokens still fills a matrix tile. The dense
T x T block of the new tokens (ancestor mask) and the merge of all chunks are done in plain JAX:
they are small next to the prefix.

Decode (T = 1) is memory-bound; a tree of B = 64 or more nodes is not: with Hq = 32 heads
and Dh = 128 the prefix attention does 4*Hq*T*Dh FLOP per prefix key against 4*Hkv*Dh bytes,
so at T = 65 the FLOP floor already exceeds the byte floor on an H200.

Backend: Pallas with the Triton lowering, selected explicitly through
``pallas.triton.CompilerParams`` (Mosaic GPU is the default lowering since jax 0.10; the
Triton lowering is deprecated in 0.11 but compiles and runs there). The same ``pallas_call``
runs with ``interpret=True`` on CPU, which is how the tests run it. Measured figures:
bench/bench_kernels.py, recorded in bench/RESULTS.md.

Row tiles: the G*T folded rows are padded to a multiple of ``block_m`` (64 or 128). T a
multiple of 16 (B = 63, 255) wastes nothing; T = 65 pads 260 rows to 320.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .attention_reference import _precision, attention_reference, check_attention_shapes

try:  # The Triton lowering is deprecated in jax 0.11 and may disappear later.
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover - depends on the installed jax
    pltriton = None

__all__ = [
    "attention", "attention_pallas", "available_impls", "auto_impl", "auto_impl_for_kind",
    "KernelConfig", "default_config",
]

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
# Finite "minus infinity" for masked scores: keeps max/exp free of inf - inf.
_NEG = -1e30


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch knobs of the prefix kernel (all static)."""
    block_m: int = 64        # folded query rows (G*T padded) per program
    block_k: int = 64        # prefix keys per inner step
    num_warps: int = 4
    num_stages: int = 3
    num_splits: int | None = None   # prefix chunks; None: chosen from the shapes
    target_programs: int = 528      # ~4 programs per H100/H200 SM
    min_chunk: int = 256            # keys; keeps partial-output traffic small
    split_edges: bool = True        # unmasked loop over interior key blocks


def _pow2_at_least(n: int, lo: int) -> int:
    return max(lo, 1 << max(0, (n - 1).bit_length()))


def default_config(t: int, g: int, dh: int) -> KernelConfig:
    """Static tile choice from the folded row count M = G*T.

    From the tile sweeps on an H200 (bench/bench_kernels.py, jax 0.11.2, Hq=32, Hkv=8, Dh=128,
    bf16, prefix 16k, 2026-11-29): decode (M <= 16) is memory-bound and liked 64-key blocks
    with a 4-deep pipeline (41.7 us vs 44-57 us for the other tiles); M = 260 (T = 65) liked
    64x64 tiles on one warpgroup (111-119 us vs 133-173); M = 1028 (T = 257) liked 128x128
    tiles on two warpgroups (265 us vs 287-453).
    """
    m = t * g
    if m <= 16:
        return KernelConfig(block_m=16, block_k=64, num_warps=4, num_stages=4)
    if m < 512:
        return KernelConfig(block_m=min(_pow2_at_least(m, 16), 64), block_k=64, num_warps=4,
                            num_stages=3)
    return KernelConfig(block_m=128, block_k=128 if dh <= 128 else 64, num_warps=8,
                        num_stages=3)


def _num_splits(cfg: KernelConfig, s: int, programs_per_split: int) -> int:
    if cfg.num_splits is not None:
        return max(1, min(cfg.num_splits, pl.cdiv(s, cfg.block_k)))
    want = pl.cdiv(cfg.target_programs, programs_per_split)
    most = max(1, pl.cdiv(s, max(cfg.min_chunk, cfg.block_k)))
    return max(1, min(want, most))


def _prefix_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, o_ref, lse_ref, *,
                   scale: float, block_k: int, chunk: int, seq: int, precision,
                   split_edges: bool):
    """One (row block, chunk, batch row, kv head): online softmax over keys [lo, hi) of a chunk.

    q_ref [BM, Dh]; k_ref, v_ref [S, Dh] (the whole row of this batch/head, never copied);
    o_ref [BM, Dh] float32, normalised; lse_ref [BM] float32 (natural log, -inf if empty).
    """
    split = pl.program_id(1)
    chunk_start = split * chunk
    lo = jnp.maximum(chunk_start, lo_ref[()])
    hi = jnp.minimum(jnp.minimum(chunk_start + chunk, hi_ref[()]), seq)
    # Key blocks touching [lo, hi): j_lo..j_hi. Blocks entirely inside: f_lo..f_hi; only the
    # (at most two) ragged edge blocks pay for masked loads and score masking. lo, hi >= 0, so
    # truncating division is floor division (and lowers to one Triton op).
    nonempty = hi > lo
    j_lo = lax.div(lo, block_k)
    j_hi = jnp.where(nonempty, lax.div(hi + (block_k - 1), block_k), j_lo)
    f_lo = jnp.where(nonempty, lax.div(lo + (block_k - 1), block_k), j_lo)
    f_hi = jnp.maximum(jnp.where(nonempty, lax.div(hi, block_k), j_lo), f_lo)

    q = q_ref[...]
    bm, dh = q.shape
    qk_scale = scale * _LOG2E   # exp2 domain: one multiply per score
    offs = jnp.arange(block_k, dtype=jnp.int32)

    def step(j, carry, masked: bool):
        acc, m_i, l_i = carry
        start = pl.multiple_of(j * block_k, block_k)
        rows = pl.ds(start, block_k)
        if masked:
            idx = start + offs
            valid = (idx >= lo) & (idx < hi)
            # Rows past S are never touched; stale/NaN rows come in as zeros.
            k = pltriton.load(k_ref.at[rows, :], mask=valid[:, None], other=0.0)
        else:
            k = k_ref[rows, :]
        s = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                            preferred_element_type=jnp.float32) * qk_scale
        if masked:
            s = jnp.where(valid[None, :], s, _NEG)
        m_new = jnp.maximum(m_i, s.max(axis=1))
        alpha = jnp.exp2(m_i - m_new)
        # Each visited block holds >= 1 valid key, so exp2(_NEG - m_new) underflows to 0.
        p = jnp.exp2(s - m_new[:, None])
        l_new = alpha * l_i + p.sum(axis=1)
        if masked:
            v = pltriton.load(v_ref.at[rows, :], mask=valid[:, None], other=0.0)
        else:
            v = v_ref[rows, :]
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=precision,
                             preferred_element_type=jnp.float32)
        return alpha[:, None] * acc + pv, m_new, l_new

    masked_step = functools.partial(step, masked=True)
    carry = (jnp.zeros((bm, dh), jnp.float32), jnp.full((bm,), _NEG, jnp.float32),
             jnp.zeros((bm,), jnp.float32))
    if split_edges:
        # The edge blocks (0 or 1 each) go through lax.cond, not loops: Triton software-
        # pipelines every loop, and a 0-or-1-trip loop would only add prologue code and buffers.
        carry = lax.cond(j_lo < jnp.minimum(f_lo, j_hi), lambda c: masked_step(j_lo, c),
                         lambda c: c, carry)
        carry = lax.fori_loop(f_lo, f_hi, functools.partial(step, masked=False), carry)
        carry = lax.cond(f_hi < j_hi, lambda c: masked_step(f_hi, c), lambda c: c, carry)
    else:
        carry = lax.fori_loop(j_lo, j_hi, masked_step, carry)
    acc, m_i, l_i = carry

    has = l_i > 0.0
    l_safe = jnp.where(has, l_i, 1.0)
    o_ref[...] = acc / l_safe[:, None]
    lse_ref[...] = jnp.where(has, m_i * _LN2 + jnp.log(l_safe), -jnp.inf)


def _prefix_partials(qf, k_cache, v_cache, kv_start, cache_len, *, scale, cfg: KernelConfig,
                     interpret: bool):
    """qf [Bt, Hkv, Mp, Dh] -> o [Bt, Hkv, n_split, Mp, Dh], lse [Bt, Hkv, n_split, Mp] (f32)."""
    bt, hkv, mp, dh = qf.shape
    s = k_cache.shape[2]
    bm, bk = cfg.block_m, cfg.block_k
    n_m = mp // bm
    n_split = _num_splits(cfg, s, n_m * bt * hkv)
    chunk = pl.cdiv(pl.cdiv(s, n_split), bk) * bk
    n_split = pl.cdiv(s, chunk)

    kernel = functools.partial(_prefix_kernel, scale=scale, block_k=bk, chunk=chunk, seq=s,
                               precision=_precision(qf.dtype),
                               # An unmasked block must fit in the cache row.
                               split_edges=cfg.split_edges and bk <= s)
    # Grid order (row block, split, b, h): the row blocks of one chunk are launched next to
    # each other, so the chunk's K/V is read from HBM once and then hits L2.
    grid = (n_m, n_split, bt, hkv)
    scalar = pl.BlockSpec((None,), lambda m, c, b, h: (b,))
    compiler_params = None
    if pltriton is not None and not interpret:
        compiler_params = pltriton.CompilerParams(num_warps=cfg.num_warps,
                                                  num_stages=cfg.num_stages)
    o, lse = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=[
            scalar,
            scalar,
            pl.BlockSpec((None, None, bm, dh), lambda m, c, b, h: (b, h, m, 0)),
            pl.BlockSpec((None, None, s, dh), lambda m, c, b, h: (b, h, 0, 0)),
            pl.BlockSpec((None, None, s, dh), lambda m, c, b, h: (b, h, 0, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, bm, dh), lambda m, c, b, h: (b, h, c, m, 0)),
            pl.BlockSpec((None, None, None, bm), lambda m, c, b, h: (b, h, c, m)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((bt, hkv, n_split, mp, dh), jnp.float32),
            jax.ShapeDtypeStruct((bt, hkv, n_split, mp), jnp.float32),
        ],
        compiler_params=compiler_params,
        interpret=interpret,
        name="ddtree_prefix_attention",
    )(kv_start, cache_len, qf, k_cache, v_cache)
    return o, lse


def _new_block(qg, k_new, v_new, new_mask, *, scale):
    """Dense T x T part. qg [Bt, Hkv, T, G, Dh] -> (o [Bt,Hkv,T,G,Dh] f32, lse [Bt,Hkv,T,G] f32)."""
    prec = _precision(qg.dtype)
    s = jnp.einsum("bhtgd,bjhd->bhtgj", qg, k_new, precision=prec,
                   preferred_element_type=jnp.float32) * scale
    s = jnp.where(new_mask[:, None, :, None, :], s, -jnp.inf)
    m = s.max(-1)                                   # finite: a row always sees itself
    p = jnp.exp(s - m[..., None])
    l = p.sum(-1)
    o = jnp.einsum("bhtgj,bjhd->bhtgd", p.astype(v_new.dtype), v_new, precision=prec,
                   preferred_element_type=jnp.float32) / l[..., None]
    return o, m + jnp.log(l)


def _unsupported(q, k_cache) -> str | None:
    """Why the kernel cannot run these shapes (None if it can)."""
    dh = q.shape[-1]
    if dh & (dh - 1) or dh < 16:
        return f"head dim {dh} is not a power of two >= 16 (Triton block shapes)"
    if math.prod(k_cache.shape) >= 2**31:
        return (f"cache of {math.prod(k_cache.shape)} elements overflows the kernel's int32 "
                "offsets")
    return None


def attention_pallas(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
                     kv_start=None, interpret: bool = False, config: KernelConfig | None = None):
    """Split-K Pallas path; same contract as :func:`attention`."""
    bt, t, hq, hkv, dh, s, g = check_attention_shapes(
        q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start)
    why = _unsupported(q, k_cache)
    if why:
        raise ValueError(f"the Pallas attention kernel cannot take these shapes: {why}; "
                         "use impl='xla'")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton);"
                           " use impl='xla'")
    cfg = config or default_config(t, g, dh)
    cache_len = cache_len.astype(jnp.int32)
    kv_start = (jnp.zeros((bt,), jnp.int32) if kv_start is None else kv_start.astype(jnp.int32))

    qg = q.reshape(bt, t, hkv, g, dh).transpose(0, 2, 1, 3, 4)      # [Bt, Hkv, T, G, Dh]
    o_new, lse_new = _new_block(qg, k_new, v_new, new_mask, scale=scale)
    if s == 0:
        o = o_new
    else:
        m_rows = t * g
        mp = pl.cdiv(m_rows, cfg.block_m) * cfg.block_m
        qf = qg.reshape(bt, hkv, m_rows, dh)
        if mp != m_rows:
            qf = jnp.pad(qf, ((0, 0), (0, 0), (0, mp - m_rows), (0, 0)))
        o_pre, lse_pre = _prefix_partials(qf, k_cache, v_cache, kv_start, cache_len,
                                          scale=scale, cfg=cfg, interpret=interpret)
        o_pre = o_pre[:, :, :, :m_rows].reshape(bt, hkv, -1, t, g, dh)
        lse_pre = lse_pre[:, :, :, :m_rows].reshape(bt, hkv, -1, t, g)
        # Merge the chunks and the new-token block by their log-sum-exps; the new block's lse is
        # finite, so the common max is finite and empty chunks (lse = -inf) weigh exactly 0.
        lse_max = jnp.maximum(lse_pre.max(2), lse_new)
        w_pre = jnp.exp(lse_pre - lse_max[:, :, None])
        w_new = jnp.exp(lse_new - lse_max)
        num = (w_pre[..., None] * o_pre).sum(2) + w_new[..., None] * o_new
        o = num / (w_pre.sum(2) + w_new)[..., None]
    return o.transpose(0, 2, 1, 3, 4).reshape(bt, t, hq, dh).astype(q.dtype)


# ----------------------------------------------------------------------------- dispatch

_IMPLS = ("auto", "xla", "pallas", "triton", "pallas_interpret")


def auto_impl_for_kind(device_kind: str, platform: str = "gpu",
                       compute_capability: str | None = None) -> str:
    """What ``impl="auto"`` runs on a device of this kind.

    The Triton-lowered kernel on NVIDIA GPUs of compute capability >= 8.0 (Ampere, Hopper,
    Blackwell); the XLA reference everywhere else (CPU, TPU, AMD, older NVIDIA) and when this
    jax has no Triton lowering.
    """
    if platform not in ("gpu", "cuda") or pltriton is None:
        return "xla"
    kind = device_kind.lower()
    if "nvidia" not in kind and compute_capability is None:
        return "xla"
    if compute_capability is not None:
        try:
            major = int(str(compute_capability).split(".")[0])
        except ValueError:
            return "xla"
        return "pallas" if major >= 8 else "xla"
    old = ("tesla", "v100", "p100", "t4", "gtx", "rtx 20", "titan")
    return "xla" if any(o in kind for o in old) else "pallas"


def auto_impl(device=None) -> str:
    """What ``impl="auto"`` runs on ``device`` (default: ``jax.devices()[0]``)."""
    device = device or jax.devices()[0]
    return auto_impl_for_kind(device.device_kind, device.platform,
                              getattr(device, "compute_capability", None))


def available_impls(device=None) -> tuple[str, ...]:
    """Impl names that can run on ``device`` (default: ``jax.devices()[0]``)."""
    device = device or jax.devices()[0]
    names = ["auto", "xla", "pallas_interpret"]
    if auto_impl(device) == "pallas":
        names[1:1] = ["pallas", "triton"]
    return tuple(names)


def attention(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
              kv_start=None, impl: str = "auto", config: KernelConfig | None = None):
    """Attention of T new tokens over a committed prefix plus themselves.

    q [Bt, T, Hq, Dh]; k_new, v_new [Bt, T, Hkv, Dh]; k_cache, v_cache [Bt, Hkv, S, Dh];
    cache_len int32[Bt] (traced; positions >= cache_len are ignored, whatever they hold);
    new_mask bool[Bt, T, T] (row i may see new key j; each row must allow itself);
    kv_start int32[Bt] or None (first visible prefix position, for sliding windows).
    Query head h uses kv head h // (Hq // Hkv). Softmax in float32. Returns [Bt, T, Hq, Dh]
    in q.dtype. impl: "auto" | "xla" | "pallas" (= "triton") | "pallas_interpret".
    """
    if impl not in _IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {_IMPLS}")
    if impl == "auto":
        impl = auto_impl()
        if impl == "pallas" and _unsupported(q, k_cache):
            impl = "xla"
    if impl == "xla":
        return attention_reference(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask,
                                   scale=scale, kv_start=kv_start)
    return attention_pallas(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                            kv_start=kv_start, interpret=(impl == "pallas_interpret"),
                            config=config)
