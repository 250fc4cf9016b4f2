"""Random parameters in the layouts of target.py and drafter.py (training, tests, benchmarks), and
of any family from its checkpoint name table (init_from_entries: hybrid targets too)."""
from __future__ import annotations

from typing import Any, Callable, Iterable

import jax
import jax.numpy as jnp

from ddtree_jax.models.config import DrafterConfig, MoeConfig, TargetConfig


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


def _moe_layer(key, h, hq, hkv, dh, moe: MoeConfig, *, qk_norm, qkv_bias, dtype, fused: bool):
    """An MoE layer: the attention of _layer, then the router, the experts (and a shared expert);
    fused: the experts' and shared expert's gate/up drawn as one "*_gate_up" (fuse_params's layout,
    which then copies nothing: a 30B-A3B-shaped model's experts fit a device once, not twice)."""
    k_attn, k_router, k_gate, k_up, k_down, k_sg, k_su, k_sd, k_sgate = jax.random.split(key, 9)
    p = _layer(k_attn, h, 1, hq, hkv, dh, qk_norm=qk_norm, qkv_bias=qkv_bias, dtype=dtype)
    for name in ("gate", "up", "down"):
        del p[name]
    e, ie = moe.num_experts, moe.expert_intermediate
    p["router"] = _dense(k_router, (h, e), dtype)
    if fused:
        p["experts_gate_up"] = _dense(k_gate, (e, h, 2 * ie), dtype, h**-0.5)
    else:
        p["experts_gate"] = _dense(k_gate, (e, h, ie), dtype, h**-0.5)
        p["experts_up"] = _dense(k_up, (e, h, ie), dtype, h**-0.5)
    p["experts_down"] = _dense(k_down, (e, ie, h), dtype, ie**-0.5)
    if moe.shared_intermediate:
        s = moe.shared_intermediate
        if fused:
            p["shared_gate_up"] = _dense(k_sg, (h, 2 * s), dtype)
        else:
            p["shared_gate"] = _dense(k_sg, (h, s), dtype)
            p["shared_up"] = _dense(k_su, (h, s), dtype)
        p["shared_down"] = _dense(k_sd, (s, h), dtype)
        p["shared_expert_gate"] = _dense(k_sgate, (h, 1), dtype)
    return p


def _jitted(fn, jit: bool):
    # One program per piece, reused for every layer of the same shapes: jitting the whole init as
    # one program compiled for 60-90 s for the Qwen3-8B shape on the H200 (its ~330 random draws
    # in one module); per piece it is a few small compiles.
    return jax.jit(fn, static_argnums=(1, 2)) if jit else fn


def init_target(cfg: TargetConfig, key: jax.Array, dtype=jnp.float32, *, jit: bool = False,
                fused_experts: bool = False) -> dict:
    """jit=True: each piece (one layer, the embedding, the head) is a jitted program run on the
    device, the layers of a kind sharing one (benchmarks: the 8B shape's weights in seconds); the
    values can differ from jit=False's in the last bit (XLA fuses the scaling into the draw).
    MoE layers (cfg.is_moe_layer) get the MoE block's params (models.moe), their gate/up already
    fused where fused_experts (see _moe_layer)."""
    keys = jax.random.split(key, cfg.num_layers + 2)
    dense = _jitted(lambda k, shape, scale: _dense(k, shape, dtype, scale), jit)
    layer = _jitted(lambda k, _a, _b: _layer(k, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                                             cfg.num_kv_heads, cfg.head_dim, qk_norm=cfg.qk_norm,
                                             qkv_bias=cfg.qkv_bias, dtype=dtype), jit)
    moe_layer = _jitted(lambda k, _a, _b: _moe_layer(k, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads,
                                                     cfg.head_dim, cfg.moe, qk_norm=cfg.qk_norm,
                                                     qkv_bias=cfg.qkv_bias, dtype=dtype, fused=fused_experts), jit)
    params = {
        "embed": dense(keys[0], (cfg.vocab_size, cfg.hidden_size), 1.0),
        "norm": jnp.ones((cfg.hidden_size,), dtype),
        "layers": [(moe_layer if cfg.is_moe_layer(n) else layer)(keys[2 + n], None, None)
                   for n in range(cfg.num_layers)],
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


def _draw_kind(path: tuple, shape: tuple[int, ...]) -> tuple[str, float]:
    """How init_from_entries draws the param at `path` of `shape`: (kind, scale)."""
    name = str(path[-1])
    if name == "A_log":
        return "A_log", 0.0
    if name == "dt_bias":
        return "ones", 0.0  # transformers' Qwen3.5 init
    if len(shape) == 1:
        if name.endswith("norm"):
            return "ones", 0.0
        return "normal", 0.02  # biases
    if name == "embed":
        return "normal", 1.0
    if name == "conv" and len(shape) == 3:  # a GDN layer's depthwise conv [C, 1, K]: fan-in K
        return "normal", shape[-1] ** -0.5
    return "normal", shape[-2] ** -0.5  # [in, out] or stacked [E, in, out]: fan-in


def _draw(key, shape: tuple[int, ...], kind: str, scale: float, dtype) -> jax.Array:
    if kind == "ones":
        return jnp.ones(shape, dtype)
    if kind == "A_log":  # decays exp(-A softplus(.)) with A in 0.02..0.8: the state keeps the text
        return jnp.log(jax.random.uniform(key, shape, jnp.float32, 0.02, 0.8)).astype(dtype)
    return _dense(key, shape, dtype, scale)


def _draw_group(keys, group: tuple, dtype) -> list[jax.Array]:
    """The params of `group` ((shape, kind, scale) each), one key each."""
    return [_draw(k, shape, kind, scale, dtype) for k, (shape, kind, scale) in zip(keys, group)]


def init_from_entries(entries: Iterable[Any], key: jax.Array, dtype=jnp.float32, *, jit: bool = False,
                      fuse: Callable[[dict], dict] | None = None) -> dict:
    """Random params of any family from its name table: `entries` are objects with `.path` (e.g.
    ("layers", 3, "linear", "qkv")) and `.shape` in our layout, as checkpoint.names.entries_for(cfg)
    lists them (a target's, a hybrid target's or a drafter's), so the tree is the one a loader
    builds. Matrices ~ N(0, 1/fan-in) as _dense, the embedding N(0, 1), norms ones, biases
    N(0, 0.02^2), a GDN layer's A_log / dt_bias as decays that keep the state. jit: each layer one
    jitted program on the device, shared by the layers of one kind (as init_target's). fuse: a
    family's fuse_params (e.g. family_of(cfg).fuse_params), given the layers as an iterator: each
    layer is fused as soon as it is drawn, so its pieces are freed before the next (the result is
    already in the inference layout, which a Generator's own fuse_params then keeps as is)."""
    top, layers = [], {}
    for e in entries:
        path, shape = tuple(e.path), tuple(e.shape)
        if path[0] == "layers":
            layers.setdefault(int(path[1]), []).append((path[2:], shape))
        else:
            top.append((path, shape))
    n = len(layers)
    if sorted(layers) != list(range(n)):
        raise ValueError(f"the entries' layers are {sorted(layers)}, not 0..{n - 1}")
    draw = jax.jit(_draw_group, static_argnums=(1, 2)) if jit else _draw_group
    keys = jax.random.split(key, n + 1)
    dtype = jnp.dtype(dtype)

    def group(k, items: list) -> dict:
        values = draw(jax.random.split(k, len(items)),
                      tuple((shape, *_draw_kind(path, shape)) for path, shape in items), dtype)
        out: dict = {}
        for (path, _), value in zip(items, values):
            node = out
            for p in path[:-1]:
                node = node.setdefault(p, {})
            node[path[-1]] = value
        return out

    params = group(keys[0], top)
    drawn = (group(keys[1 + i], layers[i]) for i in range(n))
    if fuse is None:
        return {**params, "layers": list(drawn)}
    out = fuse({**params, "layers": drawn})
    return {**out, "layers": list(out["layers"])}
