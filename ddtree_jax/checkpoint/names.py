"""The name table: Hugging Face tensor names -> our parameter tree, with every expected shape.

The expected set of tensors is derived from the config, so a checkpoint that does not match its
config.json (a missing, unexpected or misshapen tensor) is caught before any data is read.

Our layout (weight matrices are [in, out], the transpose of a HF `Linear.weight`):

    target:  {"embed": [V, H], "layers": [layer, ...], "norm": [H], "lm_head": [H, V] (untied only)}
    drafter: {"fc": [nTaps*H, H], "hidden_norm": [H], "norm": [H], "layers": [layer, ...]}
    DFlash 2 drafter (dflash2_entries): the drafter's, and "selector_proj": [H, R], "selector_pred",
             "selector_succ": [V, R]; per layer "attn_conv_base", "mlp_conv_base": [2, taps, H],
             "attn_conv_kernel", "mlp_conv_kernel": [H, 2*taps*G]
    layer:   {"attn_norm": [H], "q": [H, Hq*Dh], "k": [H, Hkv*Dh], "v": [H, Hkv*Dh], "o": [Hq*Dh, H],
              "q_bias", "k_bias", "v_bias": [..] (qkv_bias), "o_bias": [H] (attention_bias_o),
              "q_norm", "k_norm": [Dh] (qk_norm; always in the drafter),
              "mlp_norm": [H], "gate": [H, I], "up": [H, I], "down": [I, H]}
    MoE layer (TargetConfig.is_moe_layer; Qwen3-MoE, Qwen2-MoE): instead of gate/up/down,
             {"router": [H, E], "experts_gate": [E, H, Ie], "experts_up": [E, H, Ie], "experts_down": [E, Ie, H],
              and with a shared expert (Qwen2-MoE) "shared_gate": [H, Is], "shared_up": [H, Is],
              "shared_down": [Is, H], "shared_expert_gate": [H, 1]}

A HF MoE checkpoint holds each layer's experts in one of two layouts, told apart by the names present
(`fused_expert_layers`), layer by layer:
    per expert (the hub's):  mlp.experts.{e}.{gate,up,down}_proj.weight   [Ie, H], [Ie, H], [H, Ie]
    fused (transformers 5 in memory): mlp.experts.gate_up_proj [E, 2*Ie, H] (gate rows, then up rows),
                                      mlp.experts.down_proj   [E, H, Ie]
Either way an expert param's Entry lists E `Part`s, one block per expert, which the loader stacks
into one preallocated [E, in, out] array (checkpoint.tensors.StackedTensor).

A hybrid Qwen3.5 target (models/hybrid.py; `hybrid_entries`) is read from `model.` or, in a
multimodal checkpoint, `model.language_model.` names (its vision and multi-token-prediction
tensors are skipped: `SKIPPED_HYBRID`). Per layer, the norms and MLP as above, and either
    a GDN layer ("linear_attention"): {"linear": {"qkv": [H, C], "z": [H, Hv dv], "b", "a": [H, Hv],
        "conv": [C, 1, K] (as stored), "A_log", "dt_bias": [Hv], "norm": [dv], "out": [Hv dv, H]}}
        (HF linear_attn.in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, conv1d, A_log, dt_bias,
        norm, out_proj; models/gdn.py), or
    a gated attention layer ("full_attention"): {"qg": [H, Hq 2 Dh] (q_proj: per head [query | gate]),
        "k", "v", "o", "q_norm", "k_norm", biases "qg_bias", ... where attention_bias}.
A qwen3_5_moe target's MLPs are MoE blocks with a shared expert (the MoE layer above, either expert
layout). A nested param's dotted name has its whole path: "layers.0.linear.qkv".
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Container, Iterable, Mapping

from ddtree_jax.drafters.dflash2 import DFlash2Config
from ddtree_jax.errors import UserError
from ddtree_jax.models.config import DrafterConfig, MoeConfig, TargetConfig
from ddtree_jax.models.hybrid import HybridConfig

Path_ = tuple[Any, ...]  # a path into the param tree, e.g. ("layers", 3, "q")

# Buffers some exporters save; they are recomputed from the config.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
# A Qwen3.5 checkpoint's tensors beside its text model: the vision tower, the multi-token-prediction layers.
SKIPPED_HYBRID = re.compile(r"^(model\.visual\.|visual\.|mtp\.|model\.mtp\.)")


@dataclasses.dataclass(frozen=True)
class Part:
    """One expert's block of a stacked param: HF tensor `hf_name` (of shape `hf_shape`), at `index`
    on its first axis (None: the whole tensor), rows [rows[0], rows[1]) of what remains (None: all)."""

    hf_name: str
    hf_shape: tuple[int, ...]
    index: int | None = None
    rows: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class Entry:
    hf_name: str  # for a stacked param: the per-expert name with "{e}", or the fused tensor's
    path: Path_
    shape: tuple[int, ...]  # our layout
    transpose: bool  # HF stores it as [out, in] (our last two axes swapped)
    parts: tuple[Part, ...] = ()  # an expert param: slice e of ours is parts[e] (transposed if `transpose`)

    @property
    def hf_shape(self) -> tuple[int, ...]:
        """The shape of the HF tensor (each one, for a stacked param)."""
        if self.parts:
            return self.parts[0].hf_shape
        return _swap_last(self.shape) if self.transpose else self.shape

    @property
    def hf_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every HF tensor this param is read from, with its shape (one, or E for per-expert experts)."""
        if not self.parts:
            return {self.hf_name: self.hf_shape}
        return {p.hf_name: p.hf_shape for p in self.parts}

    @property
    def key(self) -> str:
        """The dotted name of our param, e.g. "layers.3.q"."""
        return ".".join(str(p) for p in self.path)


def _swap_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2]) if len(shape) >= 2 else shape


def _layer(prefix: str, i: int, *, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int,
           qk_norm: bool, qkv_bias: bool, o_bias: bool, moe: MoeConfig | None = None,
           fused: bool = False) -> list[Entry]:
    p, q, kv = f"{prefix}layers.{i}.", heads * head_dim, kv_heads * head_dim

    def mat(name: str, key: str, n_in: int, n_out: int) -> Entry:
        return Entry(p + name, ("layers", i, key), (n_in, n_out), True)

    def vec(name: str, key: str, n: int) -> Entry:
        return Entry(p + name, ("layers", i, key), (n,), False)

    out = [
        vec("input_layernorm.weight", "attn_norm", hidden),
        mat("self_attn.q_proj.weight", "q", hidden, q),
        mat("self_attn.k_proj.weight", "k", hidden, kv),
        mat("self_attn.v_proj.weight", "v", hidden, kv),
        mat("self_attn.o_proj.weight", "o", q, hidden),
    ]
    if qkv_bias:
        out += [vec("self_attn.q_proj.bias", "q_bias", q), vec("self_attn.k_proj.bias", "k_bias", kv),
                vec("self_attn.v_proj.bias", "v_bias", kv)]
    if o_bias:
        out.append(vec("self_attn.o_proj.bias", "o_bias", hidden))
    if qk_norm:
        out += [vec("self_attn.q_norm.weight", "q_norm", head_dim), vec("self_attn.k_norm.weight", "k_norm", head_dim)]
    out.append(vec("post_attention_layernorm.weight", "mlp_norm", hidden))
    if moe is not None:
        return out + _moe(p, i, hidden, moe, fused)
    out += [
        mat("mlp.gate_proj.weight", "gate", hidden, inter),
        mat("mlp.up_proj.weight", "up", hidden, inter),
        mat("mlp.down_proj.weight", "down", inter, hidden),
    ]
    return out


def _moe(p: str, i: int, hidden: int, moe: MoeConfig, fused: bool) -> list[Entry]:
    """The MLP entries of an MoE layer: router, the stacked experts, the shared expert."""
    n, ie, si = moe.num_experts, moe.expert_intermediate, moe.shared_intermediate

    def mat(name: str, key: str, n_in: int, n_out: int) -> Entry:
        return Entry(p + name, ("layers", i, key), (n_in, n_out), True)

    def experts(key: str, proj: str, n_in: int, n_out: int) -> Entry:
        if fused:  # one expert's rows of gate_up_proj [E, 2*Ie, H] (gate first) or all of down_proj [E, H, Ie]
            name = p + ("mlp.experts.down_proj" if proj == "down" else "mlp.experts.gate_up_proj")
            shape = (n, hidden, ie) if proj == "down" else (n, 2 * ie, hidden)
            rows = {"gate": (0, ie), "up": (ie, 2 * ie), "down": None}[proj]
            parts = tuple(Part(name, shape, e, rows) for e in range(n))
        else:
            name = p + f"mlp.experts.{{e}}.{proj}_proj.weight"
            parts = tuple(Part(name.format(e=e), (n_out, n_in)) for e in range(n))
        return Entry(name, ("layers", i, key), (n, n_in, n_out), True, parts)

    out = [
        mat("mlp.gate.weight", "router", hidden, n),
        experts("experts_gate", "gate", hidden, ie),
        experts("experts_up", "up", hidden, ie),
        experts("experts_down", "down", ie, hidden),
    ]
    if si:
        out += [
            mat("mlp.shared_expert.gate_proj.weight", "shared_gate", hidden, si),
            mat("mlp.shared_expert.up_proj.weight", "shared_up", hidden, si),
            mat("mlp.shared_expert.down_proj.weight", "shared_down", si, hidden),
            mat("mlp.shared_expert_gate.weight", "shared_expert_gate", hidden, 1),
        ]
    return out


FUSED_EXPERTS = re.compile(r"^model\.(?:language_model\.)?layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$")


def fused_expert_layers(found: Iterable[str]) -> frozenset[int]:
    """The layers whose experts a checkpoint holds fused (transformers 5's gate_up_proj /
    down_proj); every other MoE layer is read per expert, as published on the hub."""
    return frozenset(int(m[1]) for m in map(FUSED_EXPERTS.match, found) if m)


def target_entries(cfg: TargetConfig, fused: Container[int] = ()) -> list[Entry]:
    """Every tensor a target checkpoint must hold, in file-independent order. `fused`: the MoE
    layers whose experts are stored fused (fused_expert_layers); the others, per expert. Our
    layout, and so every Entry's path and shape, is the same either way."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out = [Entry("model.embed_tokens.weight", ("embed",), (v, h), False)]
    for i in range(cfg.num_layers):
        out += _layer("model.", i, hidden=h, inter=cfg.intermediate_size, heads=cfg.num_heads,
                      kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, qk_norm=cfg.qk_norm,
                      qkv_bias=cfg.qkv_bias, o_bias=cfg.attention_bias_o,
                      moe=cfg.moe if cfg.is_moe_layer(i) else None, fused=i in fused)
    out.append(Entry("model.norm.weight", ("norm",), (h,), False))
    if not cfg.tie_embeddings:
        out.append(Entry("lm_head.weight", ("lm_head",), (h, v), True))
    return out


def drafter_entries(cfg: DrafterConfig) -> list[Entry]:
    """Every tensor a z-lab DFlash drafter must hold (names without the optional "model." prefix).

    The drafter's attention is Qwen3's, where `attention_bias` puts a bias on q, k, v and o.
    """
    h = cfg.hidden_size
    taps = len(cfg.target_layer_ids)
    out = [
        Entry("fc.weight", ("fc",), (taps * h, h), True),
        Entry("hidden_norm.weight", ("hidden_norm",), (h,), False),
    ]
    for i in range(cfg.num_layers):
        out += _layer("", i, hidden=h, inter=cfg.intermediate_size, heads=cfg.num_heads, kv_heads=cfg.num_kv_heads,
                      head_dim=cfg.head_dim, qk_norm=True, qkv_bias=cfg.qkv_bias, o_bias=cfg.qkv_bias)
    out.append(Entry("norm.weight", ("norm",), (h,), False))
    if isinstance(cfg, DFlash2Config):
        out += dflash2_entries(cfg)
    return out


def dflash2_entries(cfg: DFlash2Config) -> list[Entry]:
    """The tensors a z-lab DFlash 2 drafter holds beyond DFlash's (drafters/dflash2.py's layout):
    per layer the two convolutions' base kernels [2, taps, H] (as stored) and kernel projections
    (HF [2 taps G, H]), and the selector's hidden projection (HF [R, H]) and codebooks [V, R]
    (stored as "candidate_selector.predecessor_codebook", without ".weight")."""
    h, v, r = cfg.hidden_size, cfg.vocab_size, cfg.selector_rank
    taps, groups = cfg.conv_kernel_size, cfg.conv_groups
    out = []
    for i in range(cfg.num_layers):
        for hf_name, key in (("attention_conv", "attn_conv"), ("mlp_conv", "mlp_conv")):
            p = f"layers.{i}.{hf_name}."
            out += [Entry(p + "base_kernel", ("layers", i, f"{key}_base"), (2, taps, h), False),
                    Entry(p + "kernel_projection.weight", ("layers", i, f"{key}_kernel"), (h, 2 * taps * groups), True)]
    return out + [
        Entry("candidate_selector.hidden_projection.weight", ("selector_proj",), (h, r), True),
        Entry("candidate_selector.predecessor_codebook", ("selector_pred",), (v, r), False),
        Entry("candidate_selector.successor_codebook", ("selector_succ",), (v, r), False),
    ]


def hybrid_prefix(found: Iterable[str]) -> str:
    """The text model's name prefix in a Qwen3.5 checkpoint: "model.language_model." (a multimodal
    one) or "model."."""
    return "model.language_model." if "model.language_model.embed_tokens.weight" in set(found) else "model."


def hybrid_entries(cfg: HybridConfig, prefix: str = "model.", fused: Container[int] = ()) -> list[Entry]:
    """Every tensor a hybrid Qwen3.5 target's text model must hold (module docstring); a
    qwen3_5_moe one's MLPs are MoE blocks with a shared expert (`_moe`; `fused` as target_entries')."""
    h, v, g = cfg.hidden_size, cfg.vocab_size, cfg.gdn
    hq, hkv, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    out = [Entry(prefix + "embed_tokens.weight", ("embed",), (v, h), False)]
    for i, kind in enumerate(cfg.layer_types):
        p = f"{prefix}layers.{i}."

        def mat(name: str, key: str | tuple, n_in: int, n_out: int) -> Entry:
            return Entry(p + name, ("layers", i, *((key,) if isinstance(key, str) else key)), (n_in, n_out), True)

        def vec(name: str, key: str | tuple, *shape: int) -> Entry:
            return Entry(p + name, ("layers", i, *((key,) if isinstance(key, str) else key)), shape, False)

        out.append(vec("input_layernorm.weight", "attn_norm", h))
        if kind == "linear_attention":
            a = "linear_attn."
            out += [mat(a + "in_proj_qkv.weight", ("linear", "qkv"), h, g.conv_dim),
                    mat(a + "in_proj_z.weight", ("linear", "z"), h, g.value_dim),
                    mat(a + "in_proj_b.weight", ("linear", "b"), h, g.num_v_heads),
                    mat(a + "in_proj_a.weight", ("linear", "a"), h, g.num_v_heads),
                    vec(a + "conv1d.weight", ("linear", "conv"), g.conv_dim, 1, g.conv_kernel),
                    vec(a + "A_log", ("linear", "A_log"), g.num_v_heads),
                    vec(a + "dt_bias", ("linear", "dt_bias"), g.num_v_heads),
                    vec(a + "norm.weight", ("linear", "norm"), g.head_v_dim),
                    mat(a + "out_proj.weight", ("linear", "out"), g.value_dim, h)]
        else:
            out += [mat("self_attn.q_proj.weight", "qg", h, hq * 2 * dh),
                    mat("self_attn.k_proj.weight", "k", h, hkv * dh), mat("self_attn.v_proj.weight", "v", h, hkv * dh),
                    mat("self_attn.o_proj.weight", "o", hq * dh, h),
                    vec("self_attn.q_norm.weight", "q_norm", dh), vec("self_attn.k_norm.weight", "k_norm", dh)]
            if cfg.attention_bias:
                out += [vec("self_attn.q_proj.bias", "qg_bias", hq * 2 * dh),
                        vec("self_attn.k_proj.bias", "k_bias", hkv * dh),
                        vec("self_attn.v_proj.bias", "v_bias", hkv * dh), vec("self_attn.o_proj.bias", "o_bias", h)]
        out.append(vec("post_attention_layernorm.weight", "mlp_norm", h))
        if cfg.moe is not None:
            out += _moe(p, i, h, cfg.moe, i in fused)
            continue
        out += [mat("mlp.gate_proj.weight", "gate", h, cfg.intermediate_size),
                mat("mlp.up_proj.weight", "up", h, cfg.intermediate_size),
                mat("mlp.down_proj.weight", "down", cfg.intermediate_size, h)]
    out.append(Entry(prefix + "norm.weight", ("norm",), (h,), False))
    if not cfg.tie_embeddings:
        out.append(Entry("lm_head.weight", ("lm_head",), (h, v), True))
    return out


def entries_for(cfg: TargetConfig | HybridConfig | DrafterConfig) -> list[Entry]:
    if isinstance(cfg, HybridConfig):
        return hybrid_entries(cfg)
    return target_entries(cfg) if isinstance(cfg, TargetConfig) else drafter_entries(cfg)


def _few(names: Iterable[str], n: int = 3) -> str:
    names = list(names)
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(repr(x) for x in names[:n]) + more


def match(entries: list[Entry], found: Mapping[str, tuple[int, ...]], *, where: str, tied: bool = False,
          strip_prefix: str | None = None, skip: re.Pattern | None = None) -> dict[str, str]:
    """Map every HF tensor the entries read (each expert's, for stacked params) to its name in the
    checkpoint, checking the sets and every shape.

    `found`: checkpoint name -> shape. `strip_prefix`: an optional prefix on checkpoint names
    (the drafter's "model."). With `tied`, a stored lm_head.weight is allowed and ignored; names
    `skip` matches are not read (a Qwen3.5 checkpoint's vision tower).
    Raises UserError naming the first problem: missing, then misshapen, then unexpected tensors.
    """
    by_name: dict[str, str] = {}
    for name in found:
        if skip is not None and skip.search(name):
            continue
        key = name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name
        by_name[key] = name
    want: dict[str, tuple[int, ...]] = {}
    for e in entries:
        want.update(e.hf_tensors)
    missing = [n for n in want if n not in by_name]
    if missing:
        raise UserError(
            f"{where}: tensor {_few(missing)} {'is' if len(missing) == 1 else 'are'} missing "
            f"(expected shape {list(want[missing[0]])}); the weights do not match config.json"
        )
    for n, shape in want.items():
        got = tuple(found[by_name[n]])
        if got != shape:
            raise UserError(
                f"{where}: tensor {by_name[n]!r} has shape {list(got)}, expected {list(shape)} from config.json"
            )
    extra = [n for k, n in by_name.items() if k not in want and not IGNORED.search(k)
             and not (tied and k == "lm_head.weight")]
    if extra:
        raise UserError(
            f"{where}: unexpected tensor {_few(extra)} (shape {list(found[extra[0]])}); the weights do not match "
            f"config.json"
        )
    return {n: by_name[n] for n in want}


def empty_tree(cfg: TargetConfig | DrafterConfig) -> dict[str, Any]:
    return {"layers": [{} for _ in range(cfg.num_layers)]}


def set_path(tree: dict[str, Any], path: Path_, value: Any) -> None:
    """tree[path] = value, the dicts on the way made where missing (a layer's "linear")."""
    node = tree
    for p in path[:-1]:
        node = node[p] if isinstance(node, list) else node.setdefault(p, {})
    node[path[-1]] = value


def get_path(tree: Any, path: Path_) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def _leaf_paths(d: Any, path: Path_) -> Iterable[Path_]:
    """The paths of a layer's params, into nested dicts (a GDN layer's "linear")."""
    if not isinstance(d, dict):
        yield path
        return
    for k, v in d.items():
        yield from _leaf_paths(v, (*path, k))


def check_params(cfg: TargetConfig | HybridConfig | DrafterConfig, params: Any, *, where: str) -> None:
    """Check a param tree against the layout the config implies; UserError names the first mismatch."""
    entries = entries_for(cfg)
    try:
        layers = params["layers"]
        n = len(layers)
    except (KeyError, TypeError):
        raise UserError(f"{where}: the params have no 'layers' list") from None
    if n != cfg.num_layers:
        raise UserError(f"{where}: the params have {n} layers, config.json says {cfg.num_layers}")
    for e in entries:
        try:
            shape = tuple(get_path(params, e.path).shape)
        except (KeyError, IndexError, TypeError, AttributeError):
            raise UserError(f"{where}: param {e.key!r} is missing") from None
        if shape != e.shape:
            raise UserError(
                f"{where}: param {e.key!r} has shape {list(shape)}, expected {list(e.shape)} from config.json")
    want = {e.path for e in entries}
    top = {(k,) for k in params if k != "layers"}
    per_layer = {p for i, layer in enumerate(layers) for p in _leaf_paths(layer, ("layers", i))}
    extra = sorted(".".join(map(str, p)) for p in (top | per_layer) - want)
    if extra:
        raise UserError(f"{where}: unexpected param {_few(extra)}; config.json does not call for it")
