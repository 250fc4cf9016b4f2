"""Random parameters in the layouts of target.py and drafter.py (training, tests, benchmarks)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ddtree_jax.models.config import DrafterConfig, TargetConfig


def _dense(key, shape, dtype, scale=None):
    scale = (shape[0] ** -0.5) if scale is None else scale
    return (jax.random.normal(key, shape, jnp.float32) * scale).astype(dtype)


def _layer(key, h, i, hq, hkv, dh, *, qk_norm, qkv_bias, dtype):
    ks = jax.random.split(key, 10)
    p = {
        "attn_norm": jnp.ones((h,), dtype),
        "q": _dense(ks[0], (h, hq * dh), dtype),
        "k": _dense(ks[1], (h, hkv * dh), dtype),
        "v": _dense(ks[2], (h, hkv * dh), dtype),
        "o": _dense(ks[3], (hq * dh, h), dtype),
        "mlp_norm": jnp.ones((h,), dtype),
        "gate": _dense(ks[4], (h, i), dtype),
        "up": _dense(ks[5], (h, i), dtype),
        "down": _dense(ks[6], (i, h), dtype),
    }
    if qk_norm:
        p["q_norm"] = jnp.ones((dh,), dtype)
        p["k_norm"] = jnp.ones((dh,), dtype)
    if qkv_bias:
        p["q_bias"] = _dense(ks[7], (hq * dh,), dtype, 0.02)
        p["k_bias"] = _dense(ks[8], (hkv * dh,), dtype, 0.02)
        p["v_bias"] = _dense(ks[9], (hkv * dh,), dtype, 0.02)
    return p


def _jitted(fn, jit: bool):
    # One program per piece, reused for every layer of the same shapes: jitting the whole init as
    # one program compiled for 60-90 s for the Qwen3-8B shape on the H200 (its ~330 random draws
    # in one module); per piece it is a few small compiles.
    return jax.jit(fn, static_argnums=(1, 2)) if jit else fn


def init_target(cfg: TargetConfig, key: jax.Array, dtype=jnp.float32, *, jit: bool = False) -> dict:
    """jit=True: each piece (one layer, the embedding, the head) is a jitted program run on the
    device, the layers sharing one (benchmarks: the 8B shape's weights in seconds); the values can
    differ from jit=False's in the last bit (XLA fuses the scaling into the draw)."""
    keys = jax.random.split(key, cfg.num_layers + 2)
    dense = _jitted(lambda k, shape, scale: _dense(k, shape, dtype, scale), jit)
    layer = _jitted(lambda k, _a, _b: _layer(k, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                                             cfg.num_kv_heads, cfg.head_dim, qk_norm=cfg.qk_norm,
                                             qkv_bias=cfg.qkv_bias, dtype=dtype), jit)
    params = {
        "embed": dense(keys[0], (cfg.vocab_size, cfg.hidden_size), 1.0),
        "norm": jnp.ones((cfg.hidden_size,), dtype),
        "layers": [layer(keys[2 + n], None, None) for n in range(cfg.num_layers)],
    }
    if cfg.attention_bias_o:
        for p in params["layers"]:
            p["o_bias"] = jnp.zeros((cfg.hidden_size,), dtype)
    if not cfg.tie_embeddings:
        params["lm_head"] = dense(keys[1], (cfg.hidden_size, cfg.vocab_size), None)
    return params


def init_drafter(cfg: DrafterConfig, key: jax.Array, dtype=jnp.float32, *, jit: bool = False) -> dict:
    """jit: as in init_target."""
    keys = jax.random.split(key, cfg.num_layers + 1)
    n_taps = len(cfg.target_layer_ids)
    dense = _jitted(lambda k, shape, scale: _dense(k, shape, dtype, scale), jit)
    layer = _jitted(lambda k, _a, _b: _layer(k, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                                             cfg.num_kv_heads, cfg.head_dim, qk_norm=True,
                                             qkv_bias=cfg.qkv_bias, dtype=dtype), jit)
    return {
        "fc": dense(keys[0], (n_taps * cfg.hidden_size, cfg.hidden_size), None),
        "hidden_norm": jnp.ones((cfg.hidden_size,), dtype),
        "norm": jnp.ones((cfg.hidden_size,), dtype),
        "layers": [layer(keys[1 + n], None, None) for n in range(cfg.num_layers)],
    }
