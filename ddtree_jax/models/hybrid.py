"""The hybrid target of transformers' `qwen3_5` text model (and `qwen3_5_moe`'s: every MLP the MoE
block of ddtree_jax.models.moe, with a shared expert): Gated DeltaNet layers (ddtree_jax.models.gdn)
interleaved with gated full-attention layers, as pure JAX functions.

Per layer i (cfg.layer_types[i]):

    h = norm(x);  x += mixer(h);  x += mlp(norm(x))       mixer: GDN ("linear_attention") or attention
    norm(x) = rmsnorm(x) * (1 + w)                         Qwen3_5RMSNorm: f32, cast after the product

The full-attention layer (Qwen3_5Attention): q_proj gives per head [query | gate] (2 Dh); q and k
are per-head RMSNorm'd (the 1 + w norm), the first rotary_dim = int(Dh * partial_rotary_factor)
dims of each head rotated (HF's half rotation; text-only position ids make mrope's three sections
one plain rope), attention over the cache, then attn * sigmoid(gate) before o_proj. Final norm,
LM head (tied to the embedding or not).

Param layout (weight matrices [in, out]; `params_from_hf` maps HF's names):
    {"embed": [V, H], "norm": [H] (HF's raw w: the norm adds 1), "lm_head": [H, V] (absent when tied),
     "layers": [{"attn_norm", "mlp_norm", "gate", "up", "down",
                 GDN layer: "linear": gdn's params (gdn.params_from_hf)
                 attention layer: "q", "q_gate" [H, Hq Dh], "k", "v" [H, Hkv Dh], "o" [Hq Dh, H],
                                  "q_norm", "k_norm" [Dh], biases "q_bias", ... where attention_bias;
                                  or, as a checkpoint holds it (checkpoint/names.py), "qg" [H, Hq 2 Dh]
                                  (per head [query | gate]) for "q" and "q_gate"
                 an MoE layer (cfg.moe): the MoE block's params (models/moe.py) for gate / up / down}]}
The inference layout (`fuse_layer`) fuses the products that read one input: "gate_up", "qgkv"
(qg | k | v) and the GDN layer's "in_proj" (gdn.fuse_params); the MoE block's as moe.py reads them.

State (`HybridState`): the attention layers' KV cache (layers.KVCache, stacked over those layers
only), the GDN layers' conv / recurrent states stacked over those layers, and lengths [Bt].
A verify pass reads the state only; `commit` writes the accepted path (KV rows appended, the GDN
states by gdn.path_states_parallel), leaving the state plain decoding of that path would leave.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.errors import ConfigError
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels.gdn_recurrence import preorder
from ddtree_jax.models import gdn
from ddtree_jax.models import moe as moe_block
from ddtree_jax.models.config import HYBRID_TARGETS, MoeConfig, RopeConfig, _Fields, _show
from ddtree_jax.models.layers import KVCache, append, apply_rope, fuse_layer_weights, linear, masked_attention, mlp, \
    rope_tables, split_heads
from ddtree_jax.tuning import XLA_KERNELS, KernelTuning

ARCHITECTURES = HYBRID_TARGETS
# qwen3_5_moe: every MLP an MoE block with a shared expert
MOE_ARCHITECTURES = ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeForConditionalGeneration")
LAYER_TYPES = ("linear_attention", "full_attention")


@dataclasses.dataclass(frozen=True)
class HybridConfig:
    """A qwen3_5 (or qwen3_5_moe: `moe` set) text model's sizes (hashable: a static argument of jax.jit)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    layer_types: tuple[str, ...]
    gdn: gdn.GdnConfig
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    attention_bias: bool = False
    rope: RopeConfig = RopeConfig()
    max_position: int = 32768
    # every layer's MLP an MoE block with a shared expert (models/moe.py; qwen3_5_moe), else dense
    moe: MoeConfig | None = None
    # the checkpoint's class; not compared: a text model and its multimodal wrapper run alike
    architecture: str = dataclasses.field(default=ARCHITECTURES[0], compare=False)

    @property
    def family(self) -> str:
        return "qwen3_5" if self.moe is None else "qwen3_5_moe"

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def attn_layers(self) -> tuple[int, ...]:
        """The full-attention layers' indices (their KV cache rows, in order)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        """The GDN layers' indices (their state rows, in order)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @staticmethod
    def from_hf(d: dict[str, Any], where: str = "config.json") -> "HybridConfig":
        """A Qwen3_5[Moe]ForCausalLM config (a text config) or a Qwen3_5[Moe]ForConditionalGeneration
        one (its text_config read; vision ignored). A bad or missing field is one ConfigError."""
        top = _Fields(d, where, missing_hint="; is this a Qwen3.5 (qwen3_5) config?")
        arch = top.architecture()
        if arch is not None and arch not in ARCHITECTURES:
            raise ConfigError(f"{where}: architecture {arch!r} is not a Qwen3.5 model; "
                              f"supported: {', '.join(ARCHITECTURES)}")
        text = top.sub("text_config")
        f = text or top
        f.missing_hint = top.missing_hint
        is_moe = arch in MOE_ARCHITECTURES
        if not is_moe and f.d.get("num_experts") is not None:
            raise ConfigError(f"{where}: {f.prefix}num_experts is {_show(f.d['num_experts'])}: a mixture-of-experts "
                              f"config under a dense Qwen3.5 architecture ({arch}); give the model's own config.json")
        if f.d.get("hidden_act", "silu") != "silu":
            raise f.bad("hidden_act", f.d["hidden_act"], '"silu"')
        n_layers = f.integer("num_hidden_layers")
        types = f.d.get("layer_types")
        if types is None:  # transformers' default: every interval-th layer full attention
            interval = f.integer("full_attention_interval", 4)
            types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers)]
        if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES for t in types):
            raise f.bad("layer_types", types, f'a list of {n_layers} entries, each "linear_attention" or '
                        '"full_attention"')
        heads, kv_heads, head_dim = f.heads()
        params = f.sub("rope_parameters")
        if params is not None and params.has("partial_rotary_factor"):
            src, factor = params, params.number("partial_rotary_factor")
        else:  # older configs keep it at the top; transformers' default is 0.25
            src, factor = f, f.number("partial_rotary_factor", 0.25)
        rotary = int(head_dim * factor)
        if factor > 1 or rotary < 2 or rotary % 2:
            raise src.bad("partial_rotary_factor", factor, f"in (0, 1], giving an even rotary width of head_dim "
                        f"({head_dim}) * factor >= 2")
        # the model class's config decides tying: the top level of a ConditionalGeneration config
        tie = top.flag("tie_word_embeddings", False) if text is not None else f.flag("tie_word_embeddings", False)
        moe = None
        if is_moe:  # transformers' router always renormalises over the k chosen; a shared expert always
            experts, top_k = f.integer("num_experts"), f.integer("num_experts_per_tok")
            if top_k > experts:
                raise f.bad("num_experts_per_tok", top_k, f"at most num_experts ({experts})")
            moe = MoeConfig(num_experts=experts, top_k=top_k, expert_intermediate=f.integer("moe_intermediate_size"),
                            norm_topk_prob=True, shared_intermediate=f.integer("shared_expert_intermediate_size"),
                            sparse_layers=(True,) * n_layers)
        return HybridConfig(
            vocab_size=f.integer("vocab_size"), hidden_size=f.integer("hidden_size"),
            # an MoE model's MLPs are all MoE blocks: intermediate_size sizes nothing
            intermediate_size=0 if is_moe else f.integer("intermediate_size"), num_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim, rotary_dim=rotary, layer_types=tuple(types), gdn=gdn.GdnConfig.from_hf(d, where),
            rms_eps=f.number("rms_norm_eps", 1e-6), tie_embeddings=tie,
            attention_bias=f.flag("attention_bias", False), rope=RopeConfig.from_hf(f.d, where),
            max_position=f.integer("max_position_embeddings", 32768), moe=moe,
            architecture=arch or ARCHITECTURES[0])


def _hf_prefix(weights: Mapping[str, Any]) -> str:
    for prefix in ("model.language_model.", "model."):
        if prefix + "embed_tokens.weight" in weights:
            return prefix
    raise ConfigError("the checkpoint has neither model.embed_tokens.weight nor "
                      "model.language_model.embed_tokens.weight; is this a Qwen3.5 checkpoint?")


def params_from_hf(weights: Mapping[str, Any], cfg: HybridConfig) -> dict:
    """Our params (module docstring) from HF tensors (numpy arrays, or anything np.asarray reads)
    named `model.` or `model.language_model.` + name; vision and MTP weights are not read. A missing
    tensor or a shape that does not fit `cfg` is one ConfigError."""
    if cfg.moe is not None:
        raise ConfigError("hybrid.params_from_hf reads dense Qwen3.5 layers; read an MoE one with "
                          "ddtree_jax.checkpoint.load_hf")
    pre = _hf_prefix(weights)
    h, hq, hkv, dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def get(name, shape):
        if name not in weights:
            raise ConfigError(f"the checkpoint lacks {name}; is this a Qwen3.5 checkpoint of this config?")
        w = np.asarray(weights[name])
        if w.shape != tuple(shape):
            raise ConfigError(f"{name} has shape {list(w.shape)}; the config needs {list(shape)}")
        return w

    inter = cfg.intermediate_size
    layers = []
    for i, kind in enumerate(cfg.layer_types):
        lp = f"{pre}layers.{i}."
        p = {"attn_norm": get(lp + "input_layernorm.weight", (h,)),
             "mlp_norm": get(lp + "post_attention_layernorm.weight", (h,)),
             "gate": get(lp + "mlp.gate_proj.weight", (inter, h)).T, "up": get(lp + "mlp.up_proj.weight", (inter, h)).T,
             "down": get(lp + "mlp.down_proj.weight", (h, inter)).T}
        if kind == "linear_attention":
            p["linear"] = gdn.params_from_hf(weights, cfg.gdn, lp + "linear_attn.")
        else:
            a = lp + "self_attn."
            # q_proj's rows are per head [query (Dh) | gate (Dh)]
            qg = get(a + "q_proj.weight", (hq * 2 * dh, h)).reshape(hq, 2, dh, h)
            p.update(q=qg[:, 0].reshape(hq * dh, h).T, q_gate=qg[:, 1].reshape(hq * dh, h).T,
                     k=get(a + "k_proj.weight", (hkv * dh, h)).T, v=get(a + "v_proj.weight", (hkv * dh, h)).T,
                     o=get(a + "o_proj.weight", (h, hq * dh)).T, q_norm=get(a + "q_norm.weight", (dh,)),
                     k_norm=get(a + "k_norm.weight", (dh,)))
            if cfg.attention_bias:
                qgb = get(a + "q_proj.bias", (hq * 2 * dh,)).reshape(hq, 2, dh)
                p.update(q_bias=qgb[:, 0].reshape(-1), q_gate_bias=qgb[:, 1].reshape(-1),
                         k_bias=get(a + "k_proj.bias", (hkv * dh,)), v_bias=get(a + "v_proj.bias", (hkv * dh,)),
                         o_bias=get(a + "o_proj.bias", (h,)))
        layers.append(p)
    params = {"embed": get(pre + "embed_tokens.weight", (cfg.vocab_size, h)), "norm": get(pre + "norm.weight", (h,)),
              "layers": layers}
    if not cfg.tie_embeddings:
        params["lm_head"] = get("lm_head.weight", (cfg.vocab_size, h)).T
    return params


# The products of a layer that read one input, fused in the inference layout (`fuse_layer`).
FUSED = {"gate_up": ("gate", "up"), "qgkv": ("qg", "k", "v"),
         "experts_gate_up": ("experts_gate", "experts_up"), "shared_gate_up": ("shared_gate", "shared_up")}


def fuse_layer(p: dict) -> dict:
    """A layer in the inference layout: FUSED's groups concatenated (layers.fuse_layer_weights) and
    the GDN layer's projections fused (gdn.fuse_params). A layout with "q" and "q_gate" apart
    (params_from_hf's) keeps its attention products apart."""
    p = fuse_layer_weights(p, FUSED if "qg" in p else {k: v for k, v in FUSED.items() if k != "qgkv"})
    return {**p, "linear": gdn.fuse_params(p["linear"])} if "linear" in p else p


# ----------------------------------------------------------------------------- state

@jax.tree_util.register_dataclass
@dataclasses.dataclass
class HybridState:
    """A batch's committed text: kv over the attention layers ([La, Bt, Hkv, S, Dh]); conv
    [Lg, Bt, K-1, C] (model dtype) and rec [Lg, Bt, Hv, dk, dv] (f32) over the GDN layers; lengths
    int32 [Bt], the committed tokens a row."""

    kv: KVCache
    conv: jax.Array
    rec: jax.Array
    lengths: jax.Array

    @staticmethod
    def zeros(cfg: HybridConfig, batch: int, max_len: int, dtype) -> "HybridState":
        g = cfg.gdn
        lg = len(cfg.gdn_layers)
        return HybridState(
            kv=KVCache.zeros(len(cfg.attn_layers), batch, cfg.num_kv_heads, max_len, cfg.head_dim, dtype),
            conv=jnp.zeros((lg, batch, g.conv_kernel - 1, g.conv_dim), dtype),
            rec=jnp.zeros((lg, batch, g.num_v_heads, g.head_k_dim, g.head_v_dim), jnp.float32),
            lengths=jnp.zeros((batch,), jnp.int32))


@functools.partial(jax.tree_util.register_dataclass, data_fields=["k", "v", "tree"], meta_fields=[])
@dataclasses.dataclass(frozen=True)
class VerifyOut:
    """What `commit` needs from a verify pass: every node's K / V of the attention layers
    [La, Bt, N, Hkv, Dh], and the GDN layers' gdn.TreeStates stacked over those layers."""

    k: jax.Array
    v: jax.Array
    tree: gdn.TreeStates


# ----------------------------------------------------------------------------- the layers

def norm(x: jax.Array, w: jax.Array, eps: float, kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """Qwen3_5RMSNorm: rmsnorm(x) * (1 + w), the product in f32 and then cast (not Llama's order);
    in the deterministic mode through its norm kernel (a row's sum in one order whatever the rows)."""
    return dispatch.rms_norm_casts(kernels, x, w, eps, unit_offset=True)


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array, rotary: int) -> jax.Array:
    """Partial rotary: the first `rotary` dims of each head turned, the rest passed."""
    if rotary == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return jnp.concatenate([apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]], axis=-1)


def _attention(p: dict, cfg: HybridConfig, h, cos, sin, kv: KVCache | None, layer: int, cache_len, new_mask,
               kernels: KernelTuning):
    """A full-attention layer's output for the normed h [Bt, T, H], and its new K, V [Bt, T, Hkv, Dh]."""
    if "qgkv" in p:  # fused at load time (fuse_layer): one product
        qg_cols = 2 * cfg.num_heads * cfg.head_dim
        qg, k, v = jnp.split(linear(h, p["qgkv"], p.get("qgkv_bias"), kernels=kernels),
                             [qg_cols, qg_cols + cfg.num_kv_heads * cfg.head_dim], axis=-1)
    else:
        k, v = (linear(h, p[n], p.get(f"{n}_bias"), kernels=kernels) for n in ("k", "v"))
        qg = linear(h, p["qg"], p.get("qg_bias"), kernels=kernels) if "qg" in p else None
    if qg is not None:  # HF's q_proj as stored: per head [query (Dh) | gate (Dh)]
        qg = qg.reshape(*h.shape[:2], cfg.num_heads, 2, cfg.head_dim)
        q, gate = qg[..., 0, :], qg[..., 1, :].reshape(*h.shape[:2], -1)
    else:
        q = split_heads(linear(h, p["q"], p.get("q_bias"), kernels=kernels), cfg.num_heads, cfg.head_dim)
        gate = linear(h, p["q_gate"], p.get("q_gate_bias"), kernels=kernels)
    k, v = split_heads(k, cfg.num_kv_heads, cfg.head_dim), split_heads(v, cfg.num_kv_heads, cfg.head_dim)
    q = _rope(norm(q, p["q_norm"], cfg.rms_eps, kernels), cos, sin, cfg.rotary_dim)
    k = _rope(norm(k, p["k_norm"], cfg.rms_eps, kernels), cos, sin, cfg.rotary_dim)
    scale = cfg.head_dim**-0.5
    if kv is None:
        o = masked_attention(q, k, v, new_mask, scale)
    else:
        o = dispatch.attention(kernels, q, k, v, kv.k, kv.v, cache_len, new_mask, scale=scale, layer=layer)
    o = o.reshape(*o.shape[:2], -1) * jax.nn.sigmoid(gate)
    return linear(o, p["o"], p.get("o_bias"), kernels=kernels), k, v


def _run(params: dict, cfg: HybridConfig, tokens, positions, state: HybridState, new_mask, mixer, taps,
         kernels: KernelTuning):
    """The decoder over new tokens [Bt, T]; `mixer(p, j, h)` runs GDN layer j (its state row j) and
    returns (y, what it keeps). Returns (final-normed h, taps or None, new K list, new V list, kept list)."""
    x = params["embed"][tokens]
    cos, sin = rope_tables(positions, cfg.rope, cfg.rotary_dim)
    new_k, new_v, kept, tapped = [], [], [], {}
    n = len(params["layers"])
    for i, p in enumerate(params["layers"]):
        with jax.named_scope(f"layer{i}"):
            h = norm(x, p["attn_norm"], cfg.rms_eps, kernels)
            if cfg.layer_types[i] == "full_attention":
                with jax.named_scope("attn"):
                    o, k, v = _attention(p, cfg, h, cos, sin, state.kv, len(new_k), state.lengths, new_mask, kernels)
                new_k.append(k)
                new_v.append(v)
            else:
                with jax.named_scope("gdn"):
                    o, keep = mixer(p["linear"], len(kept), h)
                kept.append(keep)
            x = x + o
            h = norm(x, p["mlp_norm"], cfg.rms_eps, kernels)
            with jax.named_scope("mlp" if cfg.moe is None else "moe"):
                x = x + (mlp(p, h, kernels=kernels) if cfg.moe is None
                         else moe_block.block(p, h, cfg.moe, kernels=kernels))
            tapped[i] = x
    h = norm(x, params["norm"], cfg.rms_eps, kernels)
    # tap i is HF's hidden_states[i + 1]: layer i's output, final-normed for the last layer
    tap = jnp.concatenate([h if i == n - 1 else tapped[i] for i in taps], axis=-1) if taps else None
    return h, tap, new_k, new_v, kept


def lm_head(params: dict, cfg: HybridConfig, h: jax.Array, *, kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """Logits in float32 for final-normed h [..., H]."""
    if cfg.tie_embeddings or "lm_head" not in params:
        if kernels.deterministic:  # the deterministic mode's one product: a row's logits whatever the rows
            return dispatch.matmul(kernels, h, params["embed"].T, out_dtype=jnp.float32)
        return jnp.einsum("...h,vh->...v", h, params["embed"].astype(h.dtype), preferred_element_type=jnp.float32)
    return dispatch.matmul(kernels, h, params["lm_head"], out_dtype=jnp.float32)


def _stack(xs, empty_shape, dtype):
    return jnp.stack(xs) if xs else jnp.zeros(empty_shape, dtype)


def prefill_hidden(params: dict, cfg: HybridConfig, tokens: jax.Array, state: HybridState,
                   lengths: jax.Array | None = None, *, taps: tuple[int, ...] = (),
                   kernels: KernelTuning = XLA_KERNELS):
    """`prefill` without the LM head: (final-normed h [Bt, T, H], taps or None, the new state)."""
    bt, t = tokens.shape
    lengths = jnp.full((bt,), t, jnp.int32) if lengths is None else lengths.astype(jnp.int32)
    positions = state.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (bt, t, t))

    def mixer(lp, j, h):
        y, conv, rec = gdn.prefill(lp, cfg.gdn, h, state.conv[j], state.rec[j], lengths, kernels=kernels)
        return y, (conv, rec)

    h, tap, new_k, new_v, kept = _run(params, cfg, tokens, positions, state, causal, mixer, taps, kernels)
    kv = append(state.kv, new_k, new_v, state.lengths, kernels=kernels) if new_k else state.kv
    state = HybridState(kv=kv, conv=_stack([c for c, _ in kept], state.conv.shape, state.conv.dtype),
                        rec=_stack([r for _, r in kept], state.rec.shape, state.rec.dtype),
                        lengths=state.lengths + lengths)
    return h, tap, state


def prefill(params: dict, cfg: HybridConfig, tokens: jax.Array, state: HybridState, lengths: jax.Array | None = None,
            *, taps: tuple[int, ...] = (), kernels: KernelTuning = XLA_KERNELS):
    """T new tokens a row after the state's (a prompt, or a prompt's next piece): tokens int32
    [Bt, T], right-padded; lengths int32 [Bt] the real ones a row (None: T). Returns (logits f32
    [Bt, T, V] (a padding position's meaningless), taps [Bt, T, len(taps) H] or None, the state
    with them committed). The cache must hold state.lengths + T positions (layers.append moves a
    window past its end back)."""
    h, tap, state = prefill_hidden(params, cfg, tokens, state, lengths, taps=taps, kernels=kernels)
    return lm_head(params, cfg, h, kernels=kernels), tap, state


def decode(params: dict, cfg: HybridConfig, token: jax.Array, state: HybridState, *, taps: tuple[int, ...] = (),
           kernels: KernelTuning = XLA_KERNELS):
    """One token a row, token int32 [Bt] (GDN layers in the recurrent form, gdn.step). Returns
    (logits f32 [Bt, V], taps [Bt, len(taps) H] or None, the state with it committed)."""
    bt = token.shape[0]

    def mixer(lp, j, h):
        y, conv, rec = gdn.step(lp, cfg.gdn, h[:, 0], state.conv[j], state.rec[j], kernels=kernels)
        return y[:, None], (conv, rec)

    h, tap, new_k, new_v, kept = _run(params, cfg, token[:, None], state.lengths[:, None], state,
                                      jnp.ones((bt, 1, 1), bool), mixer, taps, kernels)
    kv = append(state.kv, new_k, new_v, state.lengths, kernels=kernels) if new_k else state.kv
    state = HybridState(kv=kv, conv=_stack([c for c, _ in kept], state.conv.shape, state.conv.dtype),
                        rec=_stack([r for _, r in kept], state.rec.shape, state.rec.dtype),
                        lengths=state.lengths + 1)
    return lm_head(params, cfg, h[:, 0], kernels=kernels), None if tap is None else tap[:, 0], state


def verify_hidden(params: dict, cfg: HybridConfig, tokens: jax.Array, positions: jax.Array, parents: jax.Array,
                  ancestor_mask: jax.Array, state: HybridState, *, taps: tuple[int, ...] = (),
                  kernels: KernelTuning = XLA_KERNELS):
    """`verify_tree` without the LM head, at given positions (state.lengths + depths): returns
    (final-normed h [Bt, N, H], taps or None, the VerifyOut `commit` reads)."""
    walk = preorder(parents, ancestor_mask) if kernels.gdn_recurrent else None   # one for all layers

    def mixer(lp, j, h):
        return gdn.tree_verify(lp, cfg.gdn, h, parents, state.conv[j], state.rec[j], ancestor_mask, walk,
                               kernels=kernels)

    h, tap, new_k, new_v, kept = _run(params, cfg, tokens, positions, state, ancestor_mask, mixer, taps, kernels)
    bt, n = tokens.shape
    kv_shape = (0, bt, n, cfg.num_kv_heads, cfg.head_dim)
    tree = jax.tree.map(lambda *xs: jnp.stack(xs), *kept) if kept else None
    out = VerifyOut(k=_stack(new_k, kv_shape, state.kv.k.dtype), v=_stack(new_v, kv_shape, state.kv.v.dtype),
                    tree=tree)
    return h, tap, out


def verify_tree(params: dict, cfg: HybridConfig, tokens: jax.Array, parents: jax.Array, ancestor_mask: jax.Array,
                depths: jax.Array, state: HybridState, *, taps: tuple[int, ...] = (),
                kernels: KernelTuning = XLA_KERNELS):
    """A draft tree of N nodes a row in one pass, the state only read: tokens, parents (root's -1,
    parents before children), depths int32 [Bt, N]; ancestor_mask bool [Bt, N, N] ([b, i, j]: j
    is i or an ancestor of i). Node i's logits are the model's after the committed text followed
    by i's root path. Returns (logits f32 [Bt, N, V], taps [Bt, N, len(taps) H] or None, the
    VerifyOut `commit` reads)."""
    positions = state.lengths[:, None] + depths.astype(jnp.int32)
    h, tap, out = verify_hidden(params, cfg, tokens, positions, parents, ancestor_mask, state, taps=taps,
                                kernels=kernels)
    return lm_head(params, cfg, h, kernels=kernels), tap, out


def take_path(out: VerifyOut, path: jax.Array) -> VerifyOut:
    """The VerifyOut of the path's nodes alone (path int32 [Bt, P]), in order: commit it with the
    identity path."""
    def take(x):
        idx = path.astype(jnp.int32).reshape(1, *path.shape, *([1] * (x.ndim - 3)))
        return jnp.take_along_axis(x, idx, axis=2)

    return jax.tree.map(take, out)


def commit(cfg: HybridConfig, state: HybridState, out: VerifyOut, path: jax.Array, path_len: jax.Array,
           active: jax.Array | None = None, *, kernels: KernelTuning = XLA_KERNELS) -> HybridState:
    """The state after the accepted path of the verified tree: path int32 [Bt, P], the accepted
    nodes from the root (entries past path_len anything valid); path_len int32 [Bt] >= 1 (root +
    accepted nodes). The same state as decoding those tokens one by one. active bool [Bt] (None:
    all): a row not active keeps its state (its KV writes land past its length, unread; the GDN
    states, which have no positions, are selected). The cache must hold lengths + P positions."""
    path = path.astype(jnp.int32)
    path_len = path_len.astype(jnp.int32)
    kv = state.kv
    if out.k.shape[0]:
        kv = append(kv, list(out.k), list(out.v), state.lengths, rows=path, kernels=kernels)
    conv, rec = state.conv, state.rec
    if out.tree is not None:
        def path_states(tree, conv, rec):
            if tree.w is None:   # a recurrent verify's (gdn.TreeStates)
                return gdn.path_states_recurrent(cfg.gdn, tree, path, path_len, conv, rec, kernels=kernels)
            return gdn.path_states_parallel(cfg.gdn, tree, path, path_len, conv, rec)

        pairs = [path_states(jax.tree.map(lambda x: x[j], out.tree), state.conv[j], state.rec[j])
                 for j in range(state.conv.shape[0])]
        conv, rec = jnp.stack([c for c, _ in pairs]), jnp.stack([r for _, r in pairs])
    lengths = state.lengths + path_len
    if active is not None:
        keep = lambda new, old: jnp.where(active.reshape(1, -1, *([1] * (old.ndim - 2))), new, old)  # noqa: E731
        conv, rec = keep(conv, state.conv), keep(rec, state.rec)
        lengths = jnp.where(active, lengths, state.lengths)
    return HybridState(kv=kv, conv=conv, rec=rec, lengths=lengths)


def forward_train(params: dict, cfg: HybridConfig, tokens: jax.Array, *, taps: tuple[int, ...] = ()):
    """A full causal pass from an empty state, no cache kept (parity tests, drafter training).
    Returns (logits f32 [Bt, T, V], taps)."""
    bt, t = tokens.shape
    g = cfg.gdn
    state = HybridState(kv=None, conv=jnp.zeros((len(cfg.gdn_layers), bt, g.conv_kernel - 1, g.conv_dim),
                                                   params["embed"].dtype),
                        rec=jnp.zeros((len(cfg.gdn_layers), bt, g.num_v_heads, g.head_k_dim, g.head_v_dim),
                                      jnp.float32), lengths=jnp.zeros((bt,), jnp.int32))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (bt, t, t))

    def mixer(lp, j, h):
        y, _, _ = gdn.prefill(lp, cfg.gdn, h, state.conv[j], state.rec[j], kernels=XLA_KERNELS)
        return y, None

    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (bt, t))
    h, tap, _, _, _ = _run(params, cfg, tokens, pos, state, causal, mixer, taps, XLA_KERNELS)
    return lm_head(params, cfg, h), tap
