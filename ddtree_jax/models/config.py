"""Static model configurations, read from Hugging Face `config.json` files.

Configs are frozen, hashable dataclasses so they can be passed to `jax.jit` as static
arguments. Only what the forward pass needs is kept; everything is validated here, so that a
bad checkpoint fails at load time with a one-line message (see `ConfigError`).
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ddtree_jax.errors import ConfigError, read_json_file

SUPPORTED_TARGETS = {
    # HF architecture name -> (family, has q/k norm, has qkv bias)
    "Qwen3ForCausalLM": ("qwen3", True, False),
    "LlamaForCausalLM": ("llama", False, False),
    "Qwen2ForCausalLM": ("qwen2", False, True),
    "Qwen3MoeForCausalLM": ("qwen3_moe", True, False),
    "Qwen2MoeForCausalLM": ("qwen2_moe", False, True),
}
MOE_FAMILIES = ("qwen3_moe", "qwen2_moe")
# hybrid Gated DeltaNet / attention targets: models/hybrid.py's HybridConfig (dense, then MoE MLPs)
HYBRID_TARGETS = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
                  "Qwen3_5MoeForConditionalGeneration")
SUPPORTED_DRAFTERS = ("DFlashDraftModel",)


ROPE_KINDS = ("default", "linear", "dynamic", "yarn", "llama3")
_REQUIRED = object()
_MAX_INT = 2**31 - 1  # every size and id indexes int32 arrays


def _show(value: Any) -> str:
    """A config value as JSON spells it ("four", true, NaN, 64.5), cut to 40 characters."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class _Fields:
    """Typed, range-checked reads of one config object. A value of the wrong type or out of range
    is one ConfigError naming the file, the field, the value and what it must be; a missing
    required field is "WHERE lacks the field 'NAME'{missing_hint}"."""

    def __init__(self, d: Any, where: str, prefix: str = "", missing_hint: str = ""):
        if not isinstance(d, dict):
            if prefix:
                raise ConfigError(f"{where}: {prefix.rstrip('.')} is {_show(d)}; it must be a JSON object")
            raise ConfigError(f"{where} holds {_show(d)}, not a JSON object; give the model's config.json")
        self.d, self.where, self.prefix, self.missing_hint = d, where, prefix, missing_hint

    def bad(self, key: str, value: Any, want: str) -> ConfigError:
        return ConfigError(f"{self.where}: {self.prefix}{key} is {_show(value)}; it must be {want}")

    def has(self, key: str) -> bool:
        return key in self.d

    def _absent(self, key: str, default: Any) -> Any:
        if default is _REQUIRED:
            raise ConfigError(f"{self.where} lacks the field {self.prefix + key!r}{self.missing_hint}")
        return default

    def integer(self, key: str, default: Any = _REQUIRED, *, minimum: int | None = 1, nullable: bool = False,
                want: str | None = None) -> Any:
        """An integer (not a bool, not a float) >= `minimum`; `default` where absent (or null, if `nullable`)."""
        if key not in self.d or (nullable and self.d[key] is None):
            return self._absent(key, default)
        v = self.d[key]
        want = want or (f"an integer >= {minimum}" if minimum is not None else "an integer")
        if isinstance(v, bool) or not isinstance(v, int) or (minimum is not None and v < minimum):
            raise self.bad(key, v, want)
        if abs(v) > _MAX_INT:
            raise self.bad(key, v, f"at most {_MAX_INT}" if v > 0 else f"at least {-_MAX_INT}")
        return v

    def number(self, key: str, default: Any = _REQUIRED, *, nullable: bool = False) -> Any:
        """A finite number > 0 (an integer or a float, not a bool), as a float."""
        if key not in self.d or (nullable and self.d[key] is None):
            return self._absent(key, default)
        v = self.d[key]
        try:
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and v > 0
        except OverflowError:  # an integer too large for a float
            ok = False
        if not ok:
            raise self.bad(key, v, "a finite number > 0")
        return float(v)

    def flag(self, key: str, default: bool) -> bool:
        if key not in self.d:
            return default
        v = self.d[key]
        if not isinstance(v, bool):
            raise self.bad(key, v, "true or false")
        return v

    def sub(self, key: str) -> "_Fields | None":
        """A nested object (rope_scaling, dflash_config, ...); None where absent or null."""
        v = self.d.get(key)
        return None if v is None else _Fields(v, self.where, f"{self.prefix}{key}.", self.missing_hint)

    def architecture(self) -> str | None:
        archs = self.d.get("architectures")
        if archs is None:
            return None
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise self.bad("architectures", archs, 'a list of architecture names, e.g. ["Qwen3ForCausalLM"]')
        return archs[0] if archs else None

    def heads(self) -> tuple[int, int, int]:
        """(num_attention_heads, num_key_value_heads, head_dim), checked against each other and hidden_size."""
        heads = self.integer("num_attention_heads")
        kv_heads = self.integer("num_key_value_heads", heads, nullable=True)
        if heads % kv_heads:
            raise ConfigError(f"{self.where}: num_attention_heads ({heads}) is not a multiple of "
                              f"num_key_value_heads ({kv_heads})")
        head_dim = self.integer("head_dim", None, nullable=True)
        if head_dim is None:
            hidden = self.integer("hidden_size")
            if hidden % heads:
                raise ConfigError(f"{self.where}: hidden_size ({hidden}) is not a multiple of num_attention_heads "
                                  f"({heads}) and there is no head_dim; give head_dim")
            head_dim = hidden // heads
            if head_dim % 2:
                raise ConfigError(f"{self.where}: the head size hidden_size / num_attention_heads = {head_dim} is "
                                  "odd; rotary embeddings need an even one: give an even head_dim")
        elif head_dim % 2:
            raise self.bad("head_dim", head_dim, "even (rotary embeddings turn pairs of dimensions)")
        return heads, kv_heads, head_dim


@dataclasses.dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    kind: str = "default"  # default | linear | dynamic | yarn | llama3
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None

    @staticmethod
    def from_hf(d: dict[str, Any], where: str = "config.json") -> "RopeConfig":
        """rope_theta and rope_scaling (or transformers 5's rope_parameters), every number checked."""
        f = _Fields(d, where)
        params = f.sub("rope_parameters")
        if f.has("rope_theta"):
            theta = f.number("rope_theta")
        else:
            theta = params.number("rope_theta", 10000.0) if params is not None else 10000.0
        scaling = f.sub("rope_scaling")
        if scaling is None or not scaling.d:
            rope_type = params.d.get("rope_type") if params is not None else None
            scaling = params if rope_type not in (None, "default") else None
        if scaling is None:
            return RopeConfig(theta=theta)
        key = "rope_type" if scaling.has("rope_type") else "type"
        kind = scaling.d.get(key, "default")
        if not isinstance(kind, str) or kind not in ROPE_KINDS:
            raise ConfigError(f"{where}: rope scaling type {_show(kind)} ({scaling.prefix}{key}) is not supported; "
                              f"supported: {', '.join(ROPE_KINDS)}")
        low, high = scaling.number("low_freq_factor", 1.0), scaling.number("high_freq_factor", 4.0)
        if kind == "llama3" and high <= low:
            raise scaling.bad("high_freq_factor", high, f"greater than low_freq_factor ({low})")
        if kind == "yarn" and theta == 1.0:  # yarn's correction range divides by log(theta)
            raise f.bad("rope_theta", theta, "a finite number > 0 other than 1 for yarn scaling")
        if scaling.has("original_max_position_embeddings"):
            original = scaling.integer("original_max_position_embeddings")
        else:
            original = f.integer("max_position_embeddings", 8192)
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=scaling.number("factor", 1.0),
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position=original,
            beta_fast=scaling.number("beta_fast", 32.0),
            beta_slow=scaling.number("beta_slow", 1.0),
            attention_factor=scaling.number("attention_factor", None, nullable=True),
        )


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """A mixture-of-experts MLP (Qwen3-MoE, Qwen2-MoE): softmax top-k routing over `num_experts`
    experts of width `expert_intermediate`, optionally renormalised over the k chosen, plus an
    optional shared expert of width `shared_intermediate` (0: none) behind a sigmoid gate."""

    num_experts: int
    top_k: int
    expert_intermediate: int
    norm_topk_prob: bool
    shared_intermediate: int = 0
    # per target layer: True for an MoE block, False for a dense MLP of the target's intermediate_size
    sparse_layers: tuple[bool, ...] = ()

    @staticmethod
    def from_hf(f: "_Fields", family: str, num_layers: int) -> "MoeConfig":
        """The MoE fields of a Qwen3-MoE / Qwen2-MoE config.json; decoder_sparse_step and
        mlp_only_layers choose the sparse layers as transformers does."""
        # transformers 5 writes num_local_experts where the published configs have num_experts (a null one: unset)
        experts = f.integer("num_experts") if f.d.get("num_experts") is not None or f.d.get("num_local_experts") is None \
            else f.integer("num_local_experts")
        top_k = f.integer("num_experts_per_tok")
        if top_k > experts:
            raise f.bad("num_experts_per_tok", top_k, f"at most num_experts ({experts})")
        step = f.integer("decoder_sparse_step", 1)
        only = f.d.get("mlp_only_layers")
        if only is None:
            only = []
        if not isinstance(only, list) or not all(type(i) is int and 0 <= i < num_layers for i in only):
            raise f.bad("mlp_only_layers", only, f"a list of layer indices in [0, {num_layers})")
        # transformers builds a shared expert of its default width where the field is absent
        shared = f.integer("shared_expert_intermediate_size", 5632, minimum=0) if family == "qwen2_moe" else 0
        return MoeConfig(
            num_experts=experts,
            top_k=top_k,
            expert_intermediate=f.integer("moe_intermediate_size"),
            norm_topk_prob=f.flag("norm_topk_prob", False),
            shared_intermediate=shared,
            sparse_layers=tuple(i not in only and (i + 1) % step == 0 for i in range(num_layers)),
        )

    def is_sparse(self, layer: int) -> bool:
        return self.sparse_layers[layer]

    def block_params(self, hidden: int) -> int:
        """Weights of one MoE block: router, experts, and the shared expert with its gate."""
        shared = 3 * hidden * self.shared_intermediate + hidden if self.shared_intermediate else 0
        return hidden * self.num_experts + 3 * hidden * self.expert_intermediate * self.num_experts + shared


@dataclasses.dataclass(frozen=True)
class TargetConfig:
    """A decoder-only target: Qwen3, Qwen2 or Llama family."""

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int
    tie_embeddings: bool
    qk_norm: bool
    qkv_bias: bool
    rope: RopeConfig = RopeConfig()
    attention_bias_o: bool = False
    architecture: str = "Qwen3ForCausalLM"
    moe: MoeConfig | None = None  # None: every layer a dense MLP

    @staticmethod
    def from_hf(d: dict[str, Any], where: str = "config.json") -> "TargetConfig":
        """The target described by a HF config.json (`where` names it in errors). Every field read
        is type- and range-checked: a bad one is a ConfigError of one line."""
        f = _Fields(d, where)
        arch = f.architecture()
        if arch not in SUPPORTED_TARGETS:
            raise ConfigError(f"architecture {arch!r} is not supported as a target; supported: "
                              f"{', '.join((*SUPPORTED_TARGETS, *HYBRID_TARGETS))}")
        family, qk_norm, qkv_bias = SUPPORTED_TARGETS[arch]
        f.missing_hint = f"; is this a {arch} checkpoint?"
        hidden = f.integer("hidden_size")
        heads, kv_heads, head_dim = f.heads()
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{where}: hidden_act {_show(d.get('hidden_act'))} is not supported; only silu")
        bias = f.flag("attention_bias", qkv_bias) if family not in ("qwen2", "qwen2_moe") else False
        num_layers = f.integer("num_hidden_layers")
        moe = MoeConfig.from_hf(f, family, num_layers) if family in MOE_FAMILIES else None
        dense = moe is None or not all(moe.sparse_layers)
        return TargetConfig(
            family=family,
            vocab_size=f.integer("vocab_size"),
            hidden_size=hidden,
            # an all-MoE model's intermediate_size sizes nothing
            intermediate_size=f.integer("intermediate_size") if dense else f.integer("intermediate_size", 1),
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_eps=f.number("rms_norm_eps", 1e-6),
            max_position=f.integer("max_position_embeddings", 32768),
            tie_embeddings=f.flag("tie_word_embeddings", False),
            qk_norm=qk_norm,
            qkv_bias=True if family == "qwen2" else f.flag("qkv_bias", True) if family == "qwen2_moe" else bias,
            attention_bias_o=bias,
            rope=RopeConfig.from_hf(d, where),
            architecture=arch,
            moe=moe,
        )

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlps = sum(self.moe.block_params(h) if self.moe is not None and self.moe.is_sparse(layer) else 3 * h * i
                   for layer in range(self.num_layers))
        return self.num_layers * (attn + 2 * h) + mlps + v * h * (1 if self.tie_embeddings else 2) + h

    def is_moe_layer(self, layer: int) -> bool:
        """Whether target layer `layer` has an MoE block (else a dense MLP)."""
        return self.moe is not None and self.moe.is_sparse(layer)


def causal_layers(f: "_Fields", dfc: "_Fields", windows: tuple[int | None, ...], where: str) -> tuple[bool, ...]:
    """Whether each drafter layer's block attends causally: `is_causal`, else `dflash_config.causal`,
    else the sliding-window layers (z-lab's reference and vLLM resolve it in this order)."""
    for src, key in ((f, "is_causal"), (dfc, "causal")):
        v = src.d.get(key)
        if v is not None:
            if not isinstance(v, bool):
                raise ConfigError(f"{where}: {src.prefix}{key} is {_show(v)}; it must be true, false or null")
            return (v,) * len(windows)
    return tuple(w is not None for w in windows)


@dataclasses.dataclass(frozen=True)
class DrafterConfig:
    """A DFlash block-diffusion drafter (z-lab format)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int
    vocab_size: int
    # per layer: None for full attention, else the sliding window length
    sliding_windows: tuple[int | None, ...]
    rope: RopeConfig = RopeConfig()
    qkv_bias: bool = False
    causal: tuple[bool, ...] = ()  # per layer: the block attends causally to itself (empty: no layer does)

    @property
    def depth(self) -> int:
        """Number of future positions the drafter proposes (block_size - 1)."""
        return self.block_size - 1

    @staticmethod
    def from_hf(d: dict[str, Any], where: str = "drafter config.json") -> "DrafterConfig":
        """The drafter described by a z-lab DFlash config.json (`where` names it in errors). Every
        field read is type- and range-checked; the tapped layers and the mask id are checked
        against the target by `check_pair`."""
        f = _Fields(d, where)
        arch = f.architecture()
        dflash = f.sub("dflash_config")
        if dflash is None and arch not in SUPPORTED_DRAFTERS:
            raise ConfigError(
                f"drafter architecture {arch!r} is not supported; expected a z-lab DFlash checkpoint "
                f"({', '.join(SUPPORTED_DRAFTERS)}, config with 'dflash_config')"
            )
        dflash = dflash or _Fields({}, where, "dflash_config.")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{where}: hidden_act {_show(d.get('hidden_act'))} is not supported; only silu")
        n_layers = f.integer("num_hidden_layers")
        n_target = f.integer("num_target_layers", n_layers)
        hidden = f.integer("hidden_size")
        heads, kv_heads, head_dim = f.heads()
        if dflash.has("mask_token_id"):
            mask_id = dflash.integer("mask_token_id", minimum=None)  # its range: check_pair
        elif f.has("mask_token_id"):
            mask_id = f.integer("mask_token_id", minimum=None)
        else:
            mask_id = dflash.integer("mask_token_id")  # "lacks the field 'dflash_config.mask_token_id'"
        if dflash.d.get("target_layer_ids") is None:
            layer_ids = default_target_layer_ids(n_target, n_layers)
        else:
            layer_ids = dflash.d["target_layer_ids"]
            if (not isinstance(layer_ids, list) or not layer_ids
                    or not all(type(i) is int and 0 <= i <= _MAX_INT for i in layer_ids)):
                raise dflash.bad("target_layer_ids", layer_ids,
                                 "a non-empty list of target layer indices (integers >= 0)")
        if f.has("block_size"):
            block_size = f.integer("block_size", minimum=2, want="an integer, at least 2")
        else:
            block_size = dflash.integer("block_size", 16, minimum=2, want="an integer, at least 2")
        layer_types = f.d.get("layer_types")
        if layer_types is None:
            layer_types = ["full_attention"] * n_layers
        elif not isinstance(layer_types, list):
            raise f.bad("layer_types", layer_types, 'a list with "full_attention" or "sliding_attention" per layer')
        windows = []
        for t in layer_types:
            if t == "sliding_attention":
                if f.d.get("sliding_window") is None:
                    raise ConfigError(f"{where}: layer_types has sliding_attention but there is no sliding_window")
                windows.append(f.integer("sliding_window"))
            elif t == "full_attention":
                windows.append(None)
            else:
                raise ConfigError(f"{where}: layer type {_show(t)} is not supported; expected full_attention or "
                                  "sliding_attention")
        cfg = DrafterConfig(
            hidden_size=hidden,
            intermediate_size=f.integer("intermediate_size"),
            num_layers=n_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_eps=f.number("rms_norm_eps", 1e-6),
            block_size=block_size,
            target_layer_ids=tuple(layer_ids),
            mask_token_id=mask_id,
            num_target_layers=n_target,
            vocab_size=f.integer("vocab_size"),
            sliding_windows=tuple(windows),
            rope=RopeConfig.from_hf(d, where),
            qkv_bias=f.flag("attention_bias", False),
            causal=causal_layers(f, dflash, tuple(windows), where),
        )
        if len(cfg.sliding_windows) != cfg.num_layers:
            raise ConfigError(
                f"{where}: layer_types has {len(cfg.sliding_windows)} entries but num_hidden_layers is {cfg.num_layers}"
            )
        short = [w for w in cfg.sliding_windows if w is not None and w < cfg.block_size]
        if short:
            # The block always sees itself in full; a window shorter than the block would hide
            # part of it, which no DFlash checkpoint does.
            raise ConfigError(f"{where}: sliding_window {short[0]} is shorter than block_size {cfg.block_size}; "
                              "windows shorter than the block are not supported")
        return cfg


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule when `target_layer_ids` is absent: spread from 1 to L-3; one layer: the middle."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def check_pair(target, drafter: DrafterConfig) -> None:
    """Raise ConfigError naming every way the drafter does not fit the target (a TargetConfig or a
    models.hybrid.HybridConfig: their sizes are read by name)."""
    problems = []
    if drafter.hidden_size != target.hidden_size:
        problems.append(f"hidden size {drafter.hidden_size} != target's {target.hidden_size}")
    if drafter.vocab_size != target.vocab_size:
        problems.append(f"vocab size {drafter.vocab_size} != target's {target.vocab_size}")
    bad = [i for i in drafter.target_layer_ids if not 0 <= i < target.num_layers]
    if bad:
        problems.append(f"tapped layers {bad} are outside the target's 0..{target.num_layers - 1}")
    if not 0 <= drafter.mask_token_id < target.vocab_size:
        problems.append(f"mask token id {drafter.mask_token_id} is outside the vocabulary (size {target.vocab_size})")
    if problems:
        raise ConfigError("the drafter does not fit the target: " + "; ".join(problems) + "; use the drafter trained for this target")


def read_hf_config(path: str | Path) -> Any:
    """The JSON of a HF model directory's config.json; one ConfigError line where it is missing,
    unreadable or not JSON (from_hf checks what it holds)."""
    file = Path(path) / "config.json"
    try:
        return read_json_file(file, error=ConfigError, missing="pass a Hugging Face model directory (with config.json)")
    except UnicodeDecodeError:
        raise ConfigError(f"{file} is not UTF-8 text; give the model's config.json") from None
    except OSError as e:
        raise ConfigError(f"cannot read {file}: {e.strerror or e}") from None


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> tuple[list[float], float]:
    """Inverse frequencies (host floats, static) and the attention scaling factor, as HF computes them."""
    base = [1.0 / (rope.theta ** (2 * i / head_dim)) for i in range(head_dim // 2)]
    scale = 1.0
    if rope.kind == "linear":
        base = [f / rope.factor for f in base]
    elif rope.kind == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        out = []
        for f in base:
            wavelen = 2 * math.pi / f
            if wavelen < high_wavelen:
                out.append(f)
            elif wavelen > low_wavelen:
                out.append(f / rope.factor)
            else:
                smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
                    rope.high_freq_factor - rope.low_freq_factor
                )
                out.append((1 - smooth) * f / rope.factor + smooth * f)
        base = out
    elif rope.kind == "yarn":
        dim = head_dim

        def corr_dim(n_rot):
            return (dim * math.log(rope.original_max_position / (n_rot * 2 * math.pi))) / (2 * math.log(rope.theta))

        low = max(math.floor(corr_dim(rope.beta_fast)), 0)
        high = min(math.ceil(corr_dim(rope.beta_slow)), dim - 1)
        if low == high:
            high += 0.001
        out = []
        for i, f in enumerate(base):
            ramp = min(max((i - low) / (high - low), 0.0), 1.0)
            extrap = 1.0 - ramp
            out.append((f / rope.factor) * (1 - extrap) + f * extrap)
        base = out
        scale = rope.attention_factor if rope.attention_factor is not None else (
            0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
        )
    # "dynamic" NTK scaling only changes frequencies beyond the original context; we keep the
    # base frequencies (exact for sequences within max_position_embeddings).
    return base, float(scale)
