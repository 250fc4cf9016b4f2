"""Plain-JAX attention for the verify pass, decode and the drafter block (the XLA path).

One query block of T new tokens attends to

* the committed prefix ``k_cache[b, :, kv_start[b]:cache_len[b]]`` (a length mask, no [S, S]
  mask), and
* the T new keys, filtered by ``new_mask[b, i, j]`` (tree ancestor mask, causal, or all-true).

The two parts get separate scores and one shared softmax: a common row max, then the
exponentials of both parts summed. Scores and the softmax are float32; the probabilities are
cast to the value dtype for the value product (accumulated in float32), as flash kernels do, so
the cache is never copied to float32.

Everything at or beyond ``cache_len`` (and before ``kv_start``) is excluded with ``where`` on the
scores *and* zeroed in V, so stale entries, even inf or NaN, cannot reach the output.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .stacking import check_layer, one_layer

__all__ = ["attention_reference", "check_attention_shapes"]


def check_attention_shapes(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start=None,
                           layer=None):
    """Validate the shared interface; returns (Bt, T, Hq, Hkv, Dh, S, G).

    layer None: k_cache and v_cache are one layer's [Bt, Hkv, S, Dh]; else they are every
    layer's, stacked [L, Bt, Hkv, S, Dh], and `layer` (an int in [0, L), or an int32 scalar)
    picks the one attended to."""
    if layer is not None:
        if k_cache.ndim != 5:
            raise ValueError(f"with a layer index, k_cache must be the stacked [L, Bt, Hkv, S, Dh], "
                             f"got shape {k_cache.shape}")
        check_layer(layer, k_cache.shape[0], f"layer {layer} is out of range for a cache of {k_cache.shape[0]} layers")
        if v_cache.shape != k_cache.shape:
            raise ValueError(f"v_cache shape {v_cache.shape} must equal k_cache shape {k_cache.shape}")
        k_cache = v_cache = jax.ShapeDtypeStruct(k_cache.shape[1:], k_cache.dtype)
    if q.ndim != 4:
        raise ValueError(f"q must be [Bt, T, Hq, Dh], got shape {q.shape}")
    bt, t, hq, dh = q.shape
    if k_new.ndim != 4 or k_new.shape[:2] != (bt, t) or k_new.shape[3] != dh:
        raise ValueError(f"k_new must be [Bt, T, Hkv, Dh] = [{bt}, {t}, Hkv, {dh}], "
                         f"got {k_new.shape}")
    if v_new.shape != k_new.shape:
        raise ValueError(f"v_new shape {v_new.shape} must equal k_new shape {k_new.shape}")
    hkv = k_new.shape[2]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of kv heads ({hkv}) for GQA")
    if k_cache.ndim != 4 or (k_cache.shape[0], k_cache.shape[1], k_cache.shape[3]) != (bt, hkv, dh):
        raise ValueError(f"k_cache must be [Bt, Hkv, S, Dh] = [{bt}, {hkv}, S, {dh}], "
                         f"got {k_cache.shape}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {v_cache.shape} must equal k_cache shape {k_cache.shape}")
    if cache_len.shape != (bt,):
        raise ValueError(f"cache_len must be int32[{bt}], got shape {cache_len.shape}")
    if kv_start is not None and kv_start.shape != (bt,):
        raise ValueError(f"kv_start must be int32[{bt}], got shape {kv_start.shape}")
    if new_mask.shape != (bt, t, t):
        raise ValueError(f"new_mask must be bool[{bt}, {t}, {t}], got {new_mask.shape}")
    return bt, t, hq, hkv, dh, k_cache.shape[2], hq // hkv


def _precision(dtype):
    # f32 inputs must not silently drop to TF32 on GPU; bf16 inputs use the native path.
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT


def attention_reference(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
                        kv_start=None, layer=None):
    """Reference attention; same contract as :func:`ddtree_jax.kernels.attention`.

    Shapes: q [Bt, T, Hq, Dh]; k_new, v_new [Bt, T, Hkv, Dh]; k_cache, v_cache [Bt, Hkv, S, Dh]
    (or [L, Bt, Hkv, S, Dh] with a layer index); cache_len int32[Bt]; new_mask bool[Bt, T, T];
    kv_start int32[Bt] or None. Returns [Bt, T, Hq, Dh] in q.dtype.
    """
    bt, t, hq, hkv, dh, s, g = check_attention_shapes(
        q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer)
    k_cache, v_cache = one_layer(k_cache, layer), one_layer(v_cache, layer)
    prec = _precision(q.dtype)
    qg = q.reshape(bt, t, hkv, g, dh)

    cache_len = cache_len.astype(jnp.int32)
    pos = jnp.arange(s, dtype=jnp.int32)[None, :]
    valid = pos < cache_len[:, None]
    if kv_start is not None:
        valid &= pos >= kv_start.astype(jnp.int32)[:, None]
    valid_b = valid[:, None, None, None, :]                           # [Bt, 1, 1, 1, S]

    s_pre = jnp.einsum("bthgd,bhsd->bhgts", qg, k_cache, precision=prec,
                       preferred_element_type=jnp.float32) * scale
    s_pre = jnp.where(valid_b, s_pre, -jnp.inf)
    s_new = jnp.einsum("bthgd,bjhd->bhgtj", qg, k_new, precision=prec,
                       preferred_element_type=jnp.float32) * scale
    s_new = jnp.where(new_mask[:, None, None, :, :], s_new, -jnp.inf)

    # Finite as long as each mask row allows its own token (the contract).
    m = jnp.maximum(s_pre.max(-1, initial=-jnp.inf), s_new.max(-1))[..., None]
    p_pre = jnp.exp(s_pre - m)
    p_new = jnp.exp(s_new - m)
    l = p_pre.sum(-1) + p_new.sum(-1)                                   # [Bt, Hkv, G, T]

    v_safe = jnp.where(valid[:, None, :, None], v_cache, jnp.zeros((), v_cache.dtype))
    o = jnp.einsum("bhgts,bhsd->bhgtd", p_pre.astype(v_cache.dtype), v_safe, precision=prec,
                   preferred_element_type=jnp.float32)
    o = o + jnp.einsum("bhgtj,bjhd->bhgtd", p_new.astype(v_new.dtype), v_new, precision=prec,
                       preferred_element_type=jnp.float32)
    o = o / l[..., None]
    return o.transpose(0, 3, 1, 2, 4).reshape(bt, t, hq, dh).astype(q.dtype)
