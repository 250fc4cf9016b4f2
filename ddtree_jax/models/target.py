"""The target model: Qwen3 / Qwen2 / Llama-family decoder (and their MoE variants, Qwen3-MoE and
Qwen2-MoE) as pure functions over a param pytree.

Param layout (weight matrices are [in, out]):
    {"embed": [V, H], "norm": [H], "lm_head": [H, V] (absent when tied),
     "layers": [{"attn_norm", "q", "k", "v", "o", "q_norm"?, "k_norm"?, "q_bias"?, "k_bias"?,
                 "v_bias"?, "o_bias"?, "mlp_norm", "gate", "up", "down"}, ...]}
An MoE layer (cfg.is_moe_layer) has the MoE block's params (ddtree_jax.models.moe: "router",
"experts_gate", "experts_up", "experts_down", a shared expert's "shared_*") instead of gate/up/down.

The inference layout (`fuse_params`) fuses q/k/v and gate/up (experts' and the shared expert's
gate/up too) per layer and stacks the norm weights into "norms" (layers.stack_norms: the final
"norm" is the last row of "norms"["in"]), which the norm kernels read a layer of by an index
given at run time (where only XLA reads them, the Generator keeps them per layer:
layers.stacks_norms_for).

Layers are an unrolled Python loop over per-layer arrays: measured on the H200 it runs about twice
as fast as `lax.scan` over stacked weights for one-token steps (DESIGN.md). Each residual add is
fused with the norm that follows it (`add_rms_norm`: the MLP norm, then the next layer's attention
norm or the final norm), and the q/k norms with RoPE (`qk_norm_rope`): at batch 1 those small
kernels' launches, not their bytes, are what they cost (ddtree_jax/kernels/norms.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ddtree_jax.models import moe as moe_block
from ddtree_jax.models.config import TargetConfig
from ddtree_jax.models.layers import (
    KVCache,
    apply_rope,
    final_norm,
    fuse_layer_weights,
    layer_view,
    linear,
    masked_attention,
    mlp,
    rms_norm,
    rope_tables,
    split_heads,
    stack_norms,
)
from ddtree_jax.kernels import dispatch
from ddtree_jax.tuning import CPU_KERNELS, XLA_KERNELS, KernelTuning


def fuse_params(params: dict, *, stack: bool = True) -> dict:
    """The inference layout: q/k/v and gate/up fused per layer (see layers.fuse_layer_weights;
    an MoE layer's experts_gate/up into "experts_gate_up" [E, H, 2 Ie], its shared expert's into
    "shared_gate_up"), the norm weights stacked (layers.stack_norms) unless `stack` is False (where only XLA reads
    them: layers.stacks_norms_for). One pass over params["layers"] (any iterable): a loader may
    hand the layers over one at a time, each dropped once fused."""
    groups = {"qkv": ("q", "k", "v"), "gate_up": ("gate", "up"), "experts_gate_up": ("experts_gate", "experts_up"),
              "shared_gate_up": ("shared_gate", "shared_up")}
    fused = {**params, "layers": [fuse_layer_weights(p, groups) for p in params["layers"]]}
    return stack_norms(fused) if stack else fused


def _heads(p: dict, cfg: TargetConfig, qkv: jax.Array, cos: jax.Array, sin: jax.Array, kernels: KernelTuning):
    """The fused q/k/v projection's output split into heads, q/k-normed and RoPE'd: one kernel on
    the Pallas path."""
    norm = cfg.qk_norm
    return dispatch.qk_norm_rope(kernels, qkv, p["q_norm"] if norm else None, p["k_norm"] if norm else None, cos, sin,
                                 num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                 eps=cfg.rms_eps)


def _attend(q, k, v, cache: KVCache | None, i: int, cache_len, new_mask, scale: float, kernels: KernelTuning):
    """Layer i's attention of the new tokens over the cache's prefix and each other."""
    if cache is None:
        return masked_attention(q, k, v, new_mask, scale)
    return dispatch.attention(kernels, q, k, v, cache.k, cache.v, cache_len, new_mask, scale=scale, layer=i)


def _qkv(p: dict, cfg: TargetConfig, h: jax.Array, cos: jax.Array, sin: jax.Array, kernels: KernelTuning):
    if "qkv" in p:
        return _heads(p, cfg, linear(h, p["qkv"], p.get("qkv_bias"), kernels=kernels), cos, sin, kernels)
    q, k, v = (linear(h, p[n], p.get(f"{n}_bias"), kernels=kernels) for n in ("q", "k", "v"))
    q = split_heads(q, cfg.num_heads, cfg.head_dim)
    k = split_heads(k, cfg.num_kv_heads, cfg.head_dim)
    v = split_heads(v, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_eps)
    return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


def forward(
    params: dict,
    cfg: TargetConfig,
    tokens: jax.Array,
    positions: jax.Array,
    cache: KVCache | None,
    cache_len: jax.Array | None,
    new_mask: jax.Array,
    *,
    taps: tuple[int, ...] = (),
    kernels: KernelTuning = CPU_KERNELS,
    moe_stats: bool = False,
):
    """Run the decoder over T new tokens.

    tokens, positions: int32 [Bt, T]. new_mask: bool [Bt, T, T], which new tokens each new token
    sees (causal for a prompt, the ancestor mask for a tree). With a cache, every new token also
    sees the cache's first cache_len[b] positions. The cache is only read: the new K/V come back
    and the caller writes what it keeps (`layers.append`: all of a prompt, a tree's accepted path).
    Returns (final-normed hidden [Bt, T, H], tapped hidden states [Bt, T, len(taps)*H] or None,
    (new K per layer, new V per layer), each [Bt, T, Hkv, Dh]). Tap i is HF's hidden_states[i + 1]:
    the output of decoder layer i, final-normed for the last layer.
    kernels: which kernel each call runs (ddtree_jax.kernels.dispatch; the default, the CPU's, is
    XLA's everywhere; the engine passes its DecodeSpec's).
    moe_stats (an MoE target only; off the hot path): also return, fourth, int32 [L, E]: per layer
    how many of the pass's (token, expert) assignments each expert got, over every row given (a
    dense layer's row zeros); `moe.distinct_experts` counts the experts a pass read.
    """
    if moe_stats and cfg.moe is None:
        raise ValueError("moe_stats: the target has no mixture-of-experts layers")
    counts = [] if moe_stats else None
    eps = cfg.rms_eps
    dtype = params["embed"].dtype
    x = params["embed"][tokens].astype(dtype)
    cos, sin = rope_tables(positions, cfg.rope, cfg.head_dim)
    scale = cfg.head_dim**-0.5
    tapped = {}
    new_k, new_v = [], []
    layers = [layer_view(params, i) for i in range(len(params["layers"]))]
    # Norm weights in the order they are applied: each layer's attention norm, then the final norm.
    # The residual add that ends a layer is fused with the next of them, so h always holds the
    # normed input of what comes next and x the residual stream.
    norm_ws = [p["attn_norm"] for p in layers] + [final_norm(params)]
    if _fused_layers(params, cfg, x.shape, kernels):
        out = _forward_fused(params, cfg, x, cos, sin, cache, cache_len, new_mask, taps=taps, kernels=kernels,
                             counts=counts)
        return out if counts is None else (*out, jnp.stack(counts))
    h = dispatch.rms_norm(kernels, x, norm_ws[0], eps)
    for i, p in enumerate(layers):
        with jax.named_scope(f"layer{i}"):
            with jax.named_scope("attn"):
                q, k, v = _qkv(p, cfg, h, cos, sin, kernels)
                new_k.append(k)
                new_v.append(v)
                o = _attend(q, k, v, cache, i, cache_len, new_mask, scale, kernels)
                o = o.reshape(*o.shape[:2], -1)
                o = linear(o, p["o"], p.get("o_bias"), kernels=kernels)
            x, h = dispatch.add_rms_norm(kernels, x, o, p["mlp_norm"], eps)
            with jax.named_scope("moe" if cfg.is_moe_layer(i) else "mlp"):
                f = _mlp(p, cfg, i, h, kernels, counts)
            x, h = dispatch.add_rms_norm(kernels, x, f, norm_ws[i + 1], eps)
            if i in taps:
                tapped[i] = x
    out = h, _tap_states(tapped, h, taps, len(layers)), (new_k, new_v)
    return out if counts is None else (*out, jnp.stack(counts))


def _mlp(p: dict, cfg: TargetConfig, i: int, h: jax.Array, kernels: KernelTuning, counts: list | None):
    """Layer i's MLP of the normed h: the dense gated MLP or the MoE block (its expert counts
    appended to `counts` where given; a dense layer's as zeros)."""
    if not cfg.is_moe_layer(i):
        if counts is not None:
            counts.append(jnp.zeros((cfg.moe.num_experts,), jnp.int32))
        return mlp(p, h, kernels=kernels)
    if counts is None:
        return moe_block.block(p, h, cfg.moe, kernels=kernels)
    out, c = moe_block.block(p, h, cfg.moe, kernels=kernels, counts=True)
    counts.append(c)
    return out


def _tap_states(tapped: dict, h: jax.Array, taps: tuple[int, ...], num_layers: int) -> jax.Array | None:
    """The tapped states side by side: layer i's output, but for the last layer the final-normed
    state h, as transformers' hidden_states[L] is (what DFlash drafters tapping it were trained on)."""
    if not taps:
        return None
    return jnp.concatenate([h if i == num_layers - 1 else tapped[i] for i in taps], axis=-1)


def _fused_layers(params: dict, cfg: TargetConfig, x_shape, kernels: KernelTuning) -> bool:
    """Whether the layers run the fused form (_forward_fused): every projection of a layer takes
    the skinny-matmul kernel (ddtree_jax.kernels.dispatch.matmul_path) for these rows and takes
    prologues (dispatch.fuses_prologues), the weights are fused (qkv, gate_up) and no o bias needs
    adding between the product and the residual.
    An MoE layer's block is no such projection: only its attention's (and the dense layers') count."""
    if kernels.matmul == "xla" or not params["layers"] or not dispatch.fuses_prologues(kernels):
        return False
    p = params["layers"][0]
    if "qkv" not in p or "o_bias" in p:
        return False
    lead = x_shape[:-1]
    calls = [((*lead, cfg.hidden_size), p["qkv"], "rmsnorm"), ((*lead, p["o"].shape[0]), p["o"], None)]
    dense = [q for i, q in enumerate(params["layers"]) if not cfg.is_moe_layer(i)]
    if dense:   # every dense MLP has one shape: the first stands for all
        d = dense[0]
        if "gate_up" not in d:
            return False
        calls += [((*lead, cfg.hidden_size), d["gate_up"], "rmsnorm"),
                  ((*lead, d["gate_up"].shape[1]), d["down"], "swiglu")]
    return all(dispatch.matmul_path(kernels, shape, w, pro) != "xla" for shape, w, pro in calls)


def _forward_fused(params, cfg: TargetConfig, x, cos, sin, cache, cache_len, new_mask, *, taps, kernels: KernelTuning,
                   counts: list | None = None):
    """forward's layers with the norms and residual adds inside the projections: per layer the
    q/k/v product normalises its input (attention norm) and the o product adds the residual; the
    gate/up product normalises (MLP norm) and the down product takes silu(gate)*up and adds the
    residual: 6 kernels a layer (q/k/v, q/k norm + RoPE, attention, o, gate/up, down) instead of
    9, and no normed activation is written. The same math as the unfused layers; the kernel
    scales a row by its RMS after the product, not before, so bf16 results can differ in the
    last bit. An MoE layer keeps the fused attention; its MLP norm is the norm kernel and its
    block (moe.block) adds to the residual after."""
    eps = cfg.rms_eps
    scale = cfg.head_dim**-0.5
    tapped, new_k, new_v = {}, [], []
    for i in range(len(params["layers"])):
        p = layer_view(params, i)
        with jax.named_scope(f"layer{i}"):
            with jax.named_scope("attn"):
                qkv = dispatch.matmul(kernels, x, p["qkv"], prologue="rmsnorm", norm_w=p["attn_norm"], eps=eps)
                if "qkv_bias" in p:
                    qkv = qkv + p["qkv_bias"].astype(qkv.dtype)
                q, k, v = _heads(p, cfg, qkv, cos, sin, kernels)
                new_k.append(k)
                new_v.append(v)
                o = _attend(q, k, v, cache, i, cache_len, new_mask, scale, kernels)
                x = dispatch.matmul(kernels, o.reshape(*o.shape[:2], -1), p["o"], residual=x)
            if cfg.is_moe_layer(i):
                with jax.named_scope("moe"):
                    x = x + _mlp(p, cfg, i, dispatch.rms_norm(kernels, x, p["mlp_norm"], eps), kernels, counts)
            else:
                if counts is not None:
                    counts.append(jnp.zeros((cfg.moe.num_experts,), jnp.int32))
                with jax.named_scope("mlp"):
                    gate_up = dispatch.matmul(kernels, x, p["gate_up"], prologue="rmsnorm", norm_w=p["mlp_norm"],
                                              eps=eps)
                    x = dispatch.matmul(kernels, gate_up, p["down"], prologue="swiglu", residual=x)
            if i in taps:
                tapped[i] = x
    h = dispatch.rms_norm(kernels, x, final_norm(params), eps)
    return h, _tap_states(tapped, h, taps, len(params["layers"])), (new_k, new_v)


def lm_head(params: dict, cfg: TargetConfig, h: jax.Array, *, kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """Logits in float32 for final-normed hidden states h [..., H]. kernels: how an untied head's
    product runs (dispatch.matmul; a tied one multiplies by embed's transpose: always XLA)."""
    if cfg.tie_embeddings or "lm_head" not in params:
        w = params["embed"]
        if kernels.deterministic:  # the deterministic mode's one product: a row's logits whatever the rows
            return dispatch.matmul(kernels, h, w.T, out_dtype=jnp.float32)
        return jnp.einsum("...h,vh->...v", h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    return dispatch.matmul(kernels, h, params["lm_head"], out_dtype=jnp.float32)


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    return params["embed"][tokens]


def causal_mask(batch: int, t: int) -> jax.Array:
    return jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (batch, t, t))


def forward_train(params: dict, cfg: TargetConfig, tokens: jax.Array, *, taps: tuple[int, ...] = ()):
    """Full causal pass without a cache (training, parity tests). Returns (logits f32, taps)."""
    bt, t = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (bt, t))
    # XLA norms: training differentiates through this pass, and Pallas kernels have no VJP.
    h, tap_out, _ = forward(params, cfg, tokens, pos, None, None, causal_mask(bt, t), taps=taps,
                            kernels=XLA_KERNELS)
    return lm_head(params, cfg, h), tap_out
