"""The DFlash block-diffusion drafter as pure functions (DESIGN.md, "The DFlash drafter, precisely").

Param layout: {"fc": [nTaps*H, H], "hidden_norm": [H], "norm": [H],
               "layers": [{"attn_norm", "q", "k", "v", "o", "q_norm", "k_norm", "q_bias"?,
                           "k_bias"?, "v_bias"?, "mlp_norm", "gate", "up", "down"}, ...]}
Embeddings and the LM head are the target's. The inference layout (`fuse_params`) fuses q/k/v and
gate/up per layer, stacks every layer's k/v for the context into one matrix and the norm weights
into "norms" (layers.stack_norms; the final "norm" becomes the last row of "norms"["in"]).

Each layer's keys/values come from [context features ; noise block]; queries from the block only,
non-causal within the block unless the config makes the layer causal (`DrafterConfig.causal`:
`is_causal`, else z-lab's default, its sliding-window layers). The context part depends only on the context features (not on the layer's input), so
it is computed once per committed token and cached (`extend_cache`); the block part is recomputed
every round and dropped.

Norms, RoPE, products and attention go through ddtree_jax.kernels.dispatch (`kernels`, as in
target.forward): the inference path fuses each residual add with the norm after it and the k (or q)
norm with RoPE. The building blocks shared with training (train/drafter.py) default to XLA's path
(XLA_KERNELS), which is differentiable.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ddtree_jax.models.config import DrafterConfig
from ddtree_jax.models.layers import (
    KVCache,
    append_stacked,
    apply_rope,
    final_norm,
    fuse_layer_weights,
    layer_view,
    linear,
    mlp,
    rms_norm,
    rope_tables,
    split_heads,
    stack_norms,
)
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels.matmul import quantize_int8
from ddtree_jax.tuning import CPU_KERNELS, XLA_KERNELS, KernelTuning


def context_features(dparams: dict, cfg: DrafterConfig, taps: jax.Array, *,
                     kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """c = hidden_norm(fc(concatenated tapped target hidden states)); taps [..., nTaps*H]."""
    return dispatch.rms_norm(kernels, linear(taps, dparams["fc"], kernels=kernels), dparams["hidden_norm"],
                             cfg.rms_eps)


def fuse_params(dparams: dict, *, stack: bool = True) -> dict:
    """The inference layout: per layer q/k/v fused into "qkv" (the noise block's one product and
    one q/k-norm + RoPE kernel) and gate/up into "gate_up"; at the top, "ctx_kv" [H, L * 2 * Hkv *
    Dh], every layer's [k | v] side by side (its biases as "ctx_kv_bias"): the context features'
    K/V of all layers in one product and one norm fusion (`extend_cache`). The k/v weights are
    stored twice (in "qkv" and "ctx_kv"): 2 x L x H x 2 x Hkv x Dh more bytes of weights (84 MB for
    the 8B-shaped drafter), none more read a round.

    Why (H200 profiles of DDTree-64): with q and k/v apart, XLA merged the two products and then
    cut the result into two copies for the two norm kernels (2 slices + 2 kernels a layer); the
    commit ran 5 k/v products (one per layer, 7-8 us for 16.8 MB each, or 30 us for four merged
    by XLA) and 5 slices + 5 norm kernels.

    The norm weights are stacked (layers.stack_norms) unless `stack` is False (where only XLA
    reads them: layers.stacks_norms_for).

    One pass over dparams["layers"] (any iterable): a loader may hand the layers over one at a
    time, each dropped once fused (Generator: no second copy of the weights on the device)."""
    groups = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up")}
    layers, kv, kv_bias = [], [], []
    for p in dparams["layers"]:
        kv.append(jnp.concatenate([p["k"], p["v"]], axis=1))
        if "k_bias" in p and "v_bias" in p:
            kv_bias.append(jnp.concatenate([p["k_bias"], p["v_bias"]]))
        layers.append(fuse_layer_weights(p, groups))
    stacked = {}
    if layers:
        stacked["ctx_kv"] = jnp.concatenate(kv, axis=1)
        if len(kv_bias) == len(layers):
            stacked["ctx_kv_bias"] = jnp.concatenate(kv_bias)
    fused = {**dparams, **stacked, "layers": layers}
    return stack_norms(fused) if stack else fused


# The weight matrices a quantized drafter stores as int8 (norm weights and biases stay).
QUANT_MATRICES = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down")


def quantize_params(dparams: dict, lm_head: jax.Array) -> dict:
    """The drafter with int8 weight matrices (per-column scales, ddtree_jax.kernels.matmul.Int8Weight)
    and its own int8 copy of the target's LM head [H, V] under "lm_head" (drafting reads that
    copy; the verify keeps the exact head). Proposals change a little, so acceptance may; the
    output never does (the target verifies every token). Half the bytes a draft pass reads."""
    layers = [{k: (quantize_int8(v) if k in QUANT_MATRICES else v) for k, v in p.items()} for p in dparams["layers"]]
    top = {k: quantize_int8(dparams[k]) for k in ("fc", "ctx_kv") if k in dparams}
    return {**dparams, **top, "layers": layers, "lm_head": quantize_int8(lm_head)}


def restrict_vocab(dparams: dict, lm_head: jax.Array, ids: jax.Array, *, quantize: bool = False) -> dict:
    """The drafter drafting over a token map only (FR-Spec's frequency-ranked vocabulary, SGLang's
    `--speculative-token-map`): its own copy of the target's LM head [H, V] cut to the columns
    `ids` (int32 [V'], distinct token ids) under "lm_head", and `ids` under "draft_vocab"
    (engine.tree_stage maps the policy's indices back through it). A draft reads V'/V of the
    head's bytes; tokens outside the map are never proposed, so acceptance may drop a little,
    the output never changes (the target verifies every token, with its full head).
    quantize: also the int8 drafter (quantize_params) with the cut head."""
    head = jnp.take(lm_head, ids, axis=1)
    out = quantize_params(dparams, head) if quantize else {**dparams, "lm_head": head}
    return {**out, "draft_vocab": ids}


def _kv(p: dict, cfg: DrafterConfig, x: jax.Array, cos: jax.Array, sin: jax.Array, kernels: KernelTuning):
    k, v = linear(x, p["k"], p.get("k_bias"), kernels=kernels), linear(x, p["v"], p.get("v_bias"), kernels=kernels)
    k = split_heads(k, cfg.num_kv_heads, cfg.head_dim)
    v = split_heads(v, cfg.num_kv_heads, cfg.head_dim)
    return apply_rope(rms_norm(k, p["k_norm"], cfg.rms_eps), cos, sin), v


def context_kv(p: dict, cfg: DrafterConfig, c: jax.Array, cos: jax.Array, sin: jax.Array, *,
               kernels: KernelTuning = XLA_KERNELS):
    """One layer's K/V of the context features c [Bt, C, H] (no input layernorm on c), from the
    layer's own k/v weights (training; inference runs all layers at once: `context_kv_stacked`)."""
    return _kv(p, cfg, c, cos, sin, kernels)


def context_kv_stacked(dparams: dict, cfg: DrafterConfig, c: jax.Array, cos: jax.Array, sin: jax.Array, *,
                       kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """Every layer's K/V of the context features c [Bt, C, H] from the fused layout's "ctx_kv":
    [Bt, C, 2 L, Hkv, Dh], the L layers' K (k-normed per head with the layer's weight, roped) and
    then their V. One product and one XLA fusion (the per-head norm in the activation dtype,
    RoPE in float32: `context_kv`'s numerics)."""
    bt, n = c.shape[:2]
    layers, hkv, dh = len(dparams["layers"]), cfg.num_kv_heads, cfg.head_dim
    kv = linear(c, dparams["ctx_kv"], dparams.get("ctx_kv_bias"), kernels=kernels)
    kv = kv.reshape(bt, n, layers, 2, hkv, dh)
    norms = dparams.get("norms")
    k_norm = norms["k"] if norms is not None else jnp.stack([p["k_norm"] for p in dparams["layers"]])
    k_norm = k_norm[:, None, :]                        # [L, 1, Dh]
    k = rms_norm(kv[:, :, :, 0], k_norm, cfg.rms_eps)                                   # [Bt, C, L, Hkv, Dh]
    k = apply_rope(k.reshape(bt, n, layers * hkv, dh), cos, sin).reshape(bt, n, layers, hkv, dh)
    return jnp.concatenate([k, kv[:, :, :, 1]], axis=2)


def block_qkv_normed(p: dict, cfg: DrafterConfig, h: jax.Array, cos: jax.Array, sin: jax.Array, *,
                     kernels: KernelTuning = XLA_KERNELS):
    """One layer's Q/K/V of the noise block from h = input_layernorm(x) [Bt, bs, H]."""
    if "qkv" in p:  # the inference layout: one product, one q/k-norm + RoPE kernel on Pallas
        return dispatch.qk_norm_rope(kernels, linear(h, p["qkv"], p.get("qkv_bias"), kernels=kernels), p["q_norm"],
                                     p["k_norm"], cos, sin, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                                     head_dim=cfg.head_dim, eps=cfg.rms_eps)
    q, _, _ = dispatch.qk_norm_rope(kernels, linear(h, p["q"], p.get("q_bias"), kernels=kernels), p["q_norm"], None,
                                    cos, sin, num_heads=cfg.num_heads, num_kv_heads=0, head_dim=cfg.head_dim,
                                    eps=cfg.rms_eps)
    k, v = _kv(p, cfg, h, cos, sin, kernels)
    return q, k, v


def block_qkv(p: dict, cfg: DrafterConfig, x: jax.Array, cos: jax.Array, sin: jax.Array, *,
              kernels: KernelTuning = XLA_KERNELS):
    """One layer's Q/K/V of the noise block x [Bt, bs, H] (input_layernorm applied here)."""
    h = dispatch.rms_norm(kernels, x, p["attn_norm"], cfg.rms_eps)
    return block_qkv_normed(p, cfg, h, cos, sin, kernels=kernels)


def _attn_residual(p: dict, cfg: DrafterConfig, x: jax.Array, o: jax.Array, kernels: KernelTuning):
    """(x + o_proj(o), post_attention_layernorm of it); o: [Bt, bs, Hq, Dh]."""
    o = linear(o.reshape(*o.shape[:2], -1), p["o"], p.get("o_bias"), kernels=kernels)
    return dispatch.add_rms_norm(kernels, x, o, p["mlp_norm"], cfg.rms_eps)


def layer_finish(p: dict, cfg: DrafterConfig, x: jax.Array, o: jax.Array, *,
                 kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """Residual o_proj and MLP after attention; o: [Bt, bs, Hq, Dh]."""
    x, h = _attn_residual(p, cfg, x, o, kernels)
    return x + mlp(p, h, kernels=kernels)


def layer_finish_normed(p: dict, cfg: DrafterConfig, x: jax.Array, o: jax.Array, next_norm: jax.Array, *,
                        kernels: KernelTuning) -> tuple[jax.Array, jax.Array]:
    """layer_finish, then the norm that comes next (the next layer's input_layernorm weight or the
    final norm's), fused with the MLP's residual add: (residual stream, its norm)."""
    x, h = _attn_residual(p, cfg, x, o, kernels)
    return dispatch.add_rms_norm(kernels, x, mlp(p, h, kernels=kernels), next_norm, cfg.rms_eps)


def extend_cache(
    dparams: dict, cfg: DrafterConfig, cache: KVCache, cache_len: jax.Array, taps: jax.Array, positions: jax.Array,
    *, kernels: KernelTuning = CPU_KERNELS,
) -> KVCache:
    """Write the context K/V of new committed tokens at cache_len .. cache_len+C-1.

    taps [Bt, C, nTaps*H] and positions [Bt, C]. Rows may use fewer than C entries: the caller
    advances cache_len by the number actually committed, so the rest is overwritten later.
    kernels: how the norms, products and the cache write (all layers' in one kernel) run
    (ddtree_jax.kernels.dispatch).
    """
    c = context_features(dparams, cfg, taps, kernels=kernels)
    cos, sin = rope_tables(positions, cfg.rope, cfg.head_dim)
    if "ctx_kv" in dparams:  # the inference layout: all layers in one product and one write
        with jax.named_scope("draft_ctx"):
            kv = context_kv_stacked(dparams, cfg, c, cos, sin, kernels=kernels)
        return append_stacked(cache, kv, cache_len, kernels=kernels)
    ks, vs = [], []
    for i in range(len(dparams["layers"])):
        p = layer_view(dparams, i)
        with jax.named_scope(f"draft_ctx{i}"):
            k, v = context_kv(p, cfg, c, cos, sin, kernels=kernels)
            ks.append(k)
            vs.append(v)
    k, v = dispatch.write_cache_rows(kernels, [cache.k, cache.v], ks + vs, cache_len, None)   # every row, in order
    return KVCache(k, v)


def draft_hidden(
    dparams: dict,
    cfg: DrafterConfig,
    block_embeds: jax.Array,
    block_positions: jax.Array,
    cache: KVCache,
    cache_len: jax.Array,
    *,
    kernels: KernelTuning = CPU_KERNELS,
) -> jax.Array:
    """One pass over the noise block, non-causal but in the config's causal layers; returns
    final-normed hidden [Bt, bs, H].

    block_embeds: the target's embeddings of [root, MASK x (bs-1)]; the block sees the cached
    context [0, cache_len) (a sliding-window layer only its last `sliding_window` keys).
    kernels: which kernel each call runs (ddtree_jax.kernels.dispatch; the engine passes its
    DecodeSpec's).
    """
    bt, bs, _ = block_embeds.shape
    x = block_embeds
    cos, sin = rope_tables(block_positions, cfg.rope, cfg.head_dim)
    full = jnp.ones((bt, bs, bs), bool)
    causal = cfg.causal or (False,) * cfg.num_layers
    tril = jnp.tril(full) if any(causal) else None
    scale = cfg.head_dim**-0.5
    layers = [layer_view(dparams, i) for i in range(len(dparams["layers"]))]
    # As in target.forward: a layer's last residual add is fused with the next norm.
    norm_ws = [p["attn_norm"] for p in layers] + [final_norm(dparams)]
    fused = _fused_layers(dparams, cfg, x.shape, kernels)
    h = None if fused else dispatch.rms_norm(kernels, x, norm_ws[0], cfg.rms_eps)
    for i, p in enumerate(layers):
        with jax.named_scope(f"draft_layer{i}"):
            if fused:  # as target._forward_fused: the norms and residual adds inside the products
                q, k, v = _block_qkv_fused(p, cfg, x, cos, sin, kernels)
            else:
                q, k, v = block_qkv_normed(p, cfg, h, cos, sin, kernels=kernels)
            window = cfg.sliding_windows[i]
            kv_start = None if window is None else jnp.maximum(cache_len + bs - window, 0)
            o = dispatch.attention(kernels, q, k, v, cache.k, cache.v, cache_len, tril if causal[i] else full,
                                   scale=scale, kv_start=kv_start, layer=i)
            if fused:
                x = dispatch.matmul(kernels, o.reshape(*o.shape[:2], -1), p["o"], residual=x)
                gate_up = dispatch.matmul(kernels, x, p["gate_up"], prologue="rmsnorm", norm_w=p["mlp_norm"],
                                          eps=cfg.rms_eps)
                x = dispatch.matmul(kernels, gate_up, p["down"], prologue="swiglu", residual=x)
            else:
                x, h = layer_finish_normed(p, cfg, x, o, norm_ws[i + 1], kernels=kernels)
    return dispatch.rms_norm(kernels, x, final_norm(dparams), cfg.rms_eps) if fused else h


def _fused_layers(dparams: dict, cfg: DrafterConfig, x_shape, kernels: KernelTuning) -> bool:
    """Whether draft_hidden runs its layers fused (see target._fused_layers): every product of a
    layer in the skinny-matmul kernel, fused k/v and gate/up weights, no biases."""
    if kernels.matmul == "xla" or not dparams["layers"]:
        return False
    p = dparams["layers"][0]
    if "qkv" not in p or "gate_up" not in p or any(b in p for b in ("qkv_bias", "o_bias")):
        return False
    lead = x_shape[:-1]
    h = cfg.hidden_size
    calls = [((*lead, h), p["qkv"], "rmsnorm"), ((*lead, p["o"].shape[0]), p["o"], None),
             ((*lead, h), p["gate_up"], "rmsnorm"), ((*lead, p["gate_up"].shape[1]), p["down"], "swiglu")]
    return all(dispatch.matmul_path(kernels, shape, w, pro) != "xla" for shape, w, pro in calls)


def _block_qkv_fused(p: dict, cfg: DrafterConfig, x, cos, sin, kernels: KernelTuning):
    """block_qkv with the input layernorm inside the q and k/v products."""
    qkv = dispatch.matmul(kernels, x, p["qkv"], prologue="rmsnorm", norm_w=p["attn_norm"], eps=cfg.rms_eps)
    return dispatch.qk_norm_rope(kernels, qkv, p["q_norm"], p["k_norm"], cos, sin, num_heads=cfg.num_heads,
                                 num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, eps=cfg.rms_eps)
