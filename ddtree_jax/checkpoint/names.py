"""The name table: Hugging Face tensor names -> our parameter tree, with every expected shape.

The expected set of tensors is derived from the config, so a checkpoint that does not match its
config.json (a missing, unexpected or misshapen tensor) is caught before any data is read.

Our layout (weight matrices are [in, out], the transpose of a HF `Linear.weight`):

    target:  {"embed": [V, H], "layers": [layer, ...], "norm": [H], "lm_head": [H, V] (untied only)}
    drafter: {"fc": [nTaps*H, H], "hidden_norm": [H], "norm": [H], "layers": [layer, ...]}
    layer:   {"attn_norm": [H], "q": [H, Hq*Dh], "k": [H, Hkv*Dh], "v": [H, Hkv*Dh], "o": [Hq*Dh, H],
              "q_bias", "k_bias", "v_bias": [..] (qkv_bias), "o_bias": [H] (attention_bias_o),
              "q_norm", "k_norm": [Dh] (qk_norm; always in the drafter),
              "mlp_norm": [H], "gate": [H, I], "up": [H, I], "down": [I, H]}
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Mapping

from ddtree_jax.errors import UserError
from ddtree_jax.models.config import DrafterConfig, TargetConfig

Path_ = tuple[Any, ...]  # a path into the param tree, e.g. ("layers", 3, "q")

# Buffers some exporters save; they are recomputed from the config.
IGNORED = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


@dataclasses.dataclass(frozen=True)
class Entry:
    hf_name: str
    path: Path_
    shape: tuple[int, ...]  # our layout
    transpose: bool  # HF stores it as [out, in]

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return self.shape[::-1] if self.transpose else self.shape

    @property
    def key(self) -> str:
        """The dotted name of our param, e.g. "layers.3.q"."""
        return ".".join(str(p) for p in self.path)


def _layer(prefix: str, i: int, *, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int,
           qk_norm: bool, qkv_bias: bool, o_bias: bool) -> list[Entry]:
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
    out += [
        vec("post_attention_layernorm.weight", "mlp_norm", hidden),
        mat("mlp.gate_proj.weight", "gate", hidden, inter),
        mat("mlp.up_proj.weight", "up", hidden, inter),
        mat("mlp.down_proj.weight", "down", inter, hidden),
    ]
    return out


def target_entries(cfg: TargetConfig) -> list[Entry]:
    """Every tensor a target checkpoint must hold, in file-independent order."""
    h, v = cfg.hidden_size, cfg.vocab_size
    out = [Entry("model.embed_tokens.weight", ("embed",), (v, h), False)]
    for i in range(cfg.num_layers):
        out += _layer("model.", i, hidden=h, inter=cfg.intermediate_size, heads=cfg.num_heads,
                      kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, qk_norm=cfg.qk_norm,
                      qkv_bias=cfg.qkv_bias, o_bias=cfg.attention_bias_o)
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
    return out


def entries_for(cfg: TargetConfig | DrafterConfig) -> list[Entry]:
    return target_entries(cfg) if isinstance(cfg, TargetConfig) else drafter_entries(cfg)


def _few(names: Iterable[str], n: int = 3) -> str:
    names = list(names)
    more = f" and {len(names) - n} more" if len(names) > n else ""
    return ", ".join(repr(x) for x in names[:n]) + more


def match(entries: list[Entry], found: Mapping[str, tuple[int, ...]], *, where: str, tied: bool = False,
          strip_prefix: str | None = None) -> dict[str, str]:
    """Map each entry's HF name to the name in the checkpoint, checking the sets and every shape.

    `found`: checkpoint name -> shape. `strip_prefix`: an optional prefix on checkpoint names
    (the drafter's "model."). With `tied`, a stored lm_head.weight is allowed and ignored.
    Raises UserError naming the first problem: missing, then misshapen, then unexpected tensors.
    """
    by_name: dict[str, str] = {}
    for name in found:
        key = name[len(strip_prefix):] if strip_prefix and name.startswith(strip_prefix) else name
        by_name[key] = name
    want = {e.hf_name for e in entries}
    missing = [e for e in entries if e.hf_name not in by_name]
    if missing:
        e = missing[0]
        raise UserError(
            f"{where}: tensor {_few(m.hf_name for m in missing)} {'is' if len(missing) == 1 else 'are'} missing "
            f"(expected shape {list(e.hf_shape)}); the weights do not match config.json"
        )
    for e in entries:
        got = tuple(found[by_name[e.hf_name]])
        if got != e.hf_shape:
            raise UserError(
                f"{where}: tensor {by_name[e.hf_name]!r} has shape {list(got)}, expected {list(e.hf_shape)} "
                f"from config.json"
            )
    extra = [n for k, n in by_name.items() if k not in want and not IGNORED.search(k)
             and not (tied and k == "lm_head.weight")]
    if extra:
        raise UserError(
            f"{where}: unexpected tensor {_few(extra)} (shape {list(found[extra[0]])}); the weights do not match "
            f"config.json"
        )
    return {e.hf_name: by_name[e.hf_name] for e in entries}


def empty_tree(cfg: TargetConfig | DrafterConfig) -> dict[str, Any]:
    return {"layers": [{} for _ in range(cfg.num_layers)]}


def set_path(tree: dict[str, Any], path: Path_, value: Any) -> None:
    node = tree
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def get_path(tree: Any, path: Path_) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def check_params(cfg: TargetConfig | DrafterConfig, params: Any, *, where: str) -> None:
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
    per_layer = {("layers", i, k) for i, layer in enumerate(layers) for k in layer}
    extra = sorted(".".join(map(str, p)) for p in (top | per_layer) - want)
    if extra:
        raise UserError(f"{where}: unexpected param {_few(extra)}; config.json does not call for it")
