"""The DFlash block-diffusion drafter as pure functions (DESIGN.md, "The DFlash drafter, precisely").

Param layout: {"fc": [nTaps*H, H], "hidden_norm": [H], "norm": [H],
               "layers": [{"attn_norm", "q", "k", "v", "o", "q_norm", "k_norm", "q_bias"?,
                           "k_bias"?, "v_bias"?, "mlp_norm", "gate", "up", "down"}, ...]}
Embeddings and the LM head are the target's.

Each layer's keys/values come from [context features ; noise block]; queries from the block only,
non-causal. The context part depends only on the context features (not on the layer's input), so
it is computed once per committed token and cached (`extend_cache`); the block part is recomputed
every round and dropped.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ddtree_jax.models.config import DrafterConfig
from ddtree_jax.models.layers import (
    KVCache,
    apply_rope,
    fuse_layer_weights,
    linear,
    mlp,
    rms_norm,
    rope_tables,
    split_heads,
    write_rows,
)
from pallas_kernels import attention


def context_features(dparams: dict, cfg: DrafterConfig, taps: jax.Array) -> jax.Array:
    """c = hidden_norm(fc(concatenated tapped target hidden states)); taps [..., nTaps*H]."""
    return rms_norm(linear(taps, dparams["fc"]), dparams["hidden_norm"], cfg.rms_eps)


def fuse_params(dparams: dict) -> dict:
    """The inference layout: k/v and gate/up fused per layer (k and v read both the context
    features and the block; q reads the block only)."""
    groups = {"kv": ("k", "v"), "gate_up": ("gate", "up")}
    return {**dparams, "layers": [fuse_layer_weights(p, groups) for p in dparams["layers"]]}


def _kv(p: dict, cfg: DrafterConfig, x: jax.Array, cos: jax.Array, sin: jax.Array):
    if "kv" in p:
        k, v = jnp.split(linear(x, p["kv"], p.get("kv_bias")), 2, axis=-1)
    else:
        k, v = linear(x, p["k"], p.get("k_bias")), linear(x, p["v"], p.get("v_bias"))
    k = split_heads(k, cfg.num_kv_heads, cfg.head_dim)
    v = split_heads(v, cfg.num_kv_heads, cfg.head_dim)
    return apply_rope(rms_norm(k, p["k_norm"], cfg.rms_eps), cos, sin), v


def context_kv(p: dict, cfg: DrafterConfig, c: jax.Array, cos: jax.Array, sin: jax.Array):
    """One layer's K/V of the context features c [Bt, C, H] (no input layernorm on c)."""
    return _kv(p, cfg, c, cos, sin)


def block_qkv(p: dict, cfg: DrafterConfig, x: jax.Array, cos: jax.Array, sin: jax.Array):
    """One layer's Q/K/V of the noise block x [Bt, bs, H] (after input_layernorm)."""
    h = rms_norm(x, p["attn_norm"], cfg.rms_eps)
    q = split_heads(linear(h, p["q"], p.get("q_bias")), cfg.num_heads, cfg.head_dim)
    q = apply_rope(rms_norm(q, p["q_norm"], cfg.rms_eps), cos, sin)
    k, v = _kv(p, cfg, h, cos, sin)
    return q, k, v


def layer_finish(p: dict, cfg: DrafterConfig, x: jax.Array, o: jax.Array) -> jax.Array:
    """Residual o_proj and MLP after attention; o: [Bt, bs, Hq, Dh]."""
    x = x + linear(o.reshape(*o.shape[:2], -1), p["o"], p.get("o_bias"))
    return x + mlp(p, rms_norm(x, p["mlp_norm"], cfg.rms_eps))


def extend_cache(
    dparams: dict, cfg: DrafterConfig, cache: KVCache, cache_len: jax.Array, taps: jax.Array, positions: jax.Array
) -> KVCache:
    """Write the context K/V of new committed tokens at cache_len .. cache_len+C-1.

    taps [Bt, C, nTaps*H] and positions [Bt, C]. Rows may use fewer than C entries: the caller
    advances cache_len by the number actually committed, so the rest is overwritten later.
    """
    c = context_features(dparams, cfg, taps)
    cos, sin = rope_tables(positions, cfg.rope, cfg.head_dim)
    ks, vs = [], []
    for i, p in enumerate(dparams["layers"]):
        with jax.named_scope(f"draft_ctx{i}"):
            k, v = context_kv(p, cfg, c, cos, sin)
            ks.append(write_rows(cache.k[i], k, cache_len))
            vs.append(write_rows(cache.v[i], v, cache_len))
    return KVCache(ks, vs)


def draft_hidden(
    dparams: dict,
    cfg: DrafterConfig,
    block_embeds: jax.Array,
    block_positions: jax.Array,
    cache: KVCache,
    cache_len: jax.Array,
    *,
    attn_impl: str = "auto",
) -> jax.Array:
    """One non-causal pass over the noise block; returns final-normed hidden [Bt, bs, H].

    block_embeds: the target's embeddings of [root, MASK x (bs-1)]; the block sees the cached
    context [0, cache_len) (a sliding-window layer only its last `sliding_window` keys).
    """
    bt, bs, _ = block_embeds.shape
    x = block_embeds
    cos, sin = rope_tables(block_positions, cfg.rope, cfg.head_dim)
    full = jnp.ones((bt, bs, bs), bool)
    scale = cfg.head_dim**-0.5
    for i, p in enumerate(dparams["layers"]):
        with jax.named_scope(f"draft_layer{i}"):
            q, k, v = block_qkv(p, cfg, x, cos, sin)
            window = cfg.sliding_windows[i]
            kv_start = None if window is None else jnp.maximum(cache_len + bs - window, 0)
            o = attention(q, k, v, cache.k[i], cache.v[i], cache_len, full, scale=scale,
                          kv_start=kv_start, impl=attn_impl)
            x = layer_finish(p, cfg, x, o)
    return rms_norm(x, dparams["norm"], cfg.rms_eps)
