"""Static model configurations, read from Hugging Face `config.json` files.

Configs are frozen, hashable dataclasses so they can be passed to `jax.jit` as static
arguments. Only what the forward pass needs is kept; everything is validated here, so that a
bad checkpoint fails at load time with a one-line message (see `ConfigError`).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from ddtree_jax.errors import ConfigError, read_json_file

SUPPORTED_TARGETS = {
    # HF architecture name -> (family, has q/k norm, has qkv bias)
    "Qwen3ForCausalLM": ("qwen3", True, False),
    "LlamaForCausalLM": ("llama", False, False),
    "Qwen2ForCausalLM": ("qwen2", False, True),
}
SUPPORTED_DRAFTERS = ("DFlashDraftModel",)


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
    def from_hf(d: dict[str, Any]) -> "RopeConfig":
        params = d.get("rope_parameters") or {}
        theta = float(d.get("rope_theta", params.get("rope_theta", 10000.0)))
        scaling = d.get("rope_scaling") or (params if params.get("rope_type") not in (None, "default") else None)
        if not scaling:
            return RopeConfig(theta=theta)
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "linear", "dynamic", "yarn", "llama3"):
            raise ConfigError(
                f"rope scaling type {kind!r} is not supported; supported: default, linear, dynamic, yarn, llama3"
            )
        return RopeConfig(
            theta=theta,
            kind=kind,
            factor=float(scaling.get("factor", 1.0)),
            low_freq_factor=float(scaling.get("low_freq_factor", 1.0)),
            high_freq_factor=float(scaling.get("high_freq_factor", 4.0)),
            original_max_position=int(
                scaling.get("original_max_position_embeddings", d.get("max_position_embeddings", 8192))
            ),
            beta_fast=float(scaling.get("beta_fast", 32.0)),
            beta_slow=float(scaling.get("beta_slow", 1.0)),
            attention_factor=scaling.get("attention_factor"),
        )


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

    @staticmethod
    def from_hf(d: dict[str, Any]) -> "TargetConfig":
        arch = (d.get("architectures") or [None])[0]
        if arch not in SUPPORTED_TARGETS:
            raise ConfigError(
                f"architecture {arch!r} is not supported as a target; supported: {', '.join(SUPPORTED_TARGETS)}"
            )
        family, qk_norm, qkv_bias = SUPPORTED_TARGETS[arch]
        try:
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            cfg = TargetConfig(
                family=family,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_eps=float(d.get("rms_norm_eps", 1e-6)),
                max_position=int(d.get("max_position_embeddings", 32768)),
                tie_embeddings=bool(d.get("tie_word_embeddings", False)),
                qk_norm=qk_norm,
                qkv_bias=bool(d.get("attention_bias", qkv_bias)) if family != "qwen2" else True,
                attention_bias_o=bool(d.get("attention_bias", False)) if family != "qwen2" else False,
                rope=RopeConfig.from_hf(d),
                architecture=arch,
            )
        except KeyError as e:
            raise ConfigError(f"config.json lacks the field {e.args[0]!r}; is this a {arch} checkpoint?") from None
        if cfg.num_heads % cfg.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({cfg.num_heads}) is not a multiple of num_key_value_heads ({cfg.num_kv_heads})"
            )
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {d.get('hidden_act')!r} is not supported; only silu")
        return cfg

    @property
    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        per_layer = attn + 3 * h * i + 2 * h
        return self.num_layers * per_layer + v * h * (1 if self.tie_embeddings else 2) + h


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

    @property
    def depth(self) -> int:
        """Number of future positions the drafter proposes (block_size - 1)."""
        return self.block_size - 1

    @staticmethod
    def from_hf(d: dict[str, Any]) -> "DrafterConfig":
        arch = (d.get("architectures") or [None])[0]
        dflash = d.get("dflash_config")
        if dflash is None and arch not in SUPPORTED_DRAFTERS:
            raise ConfigError(
                f"drafter architecture {arch!r} is not supported; expected a z-lab DFlash checkpoint "
                f"({', '.join(SUPPORTED_DRAFTERS)}, config with 'dflash_config')"
            )
        dflash = dflash or {}
        try:
            n_layers = int(d["num_hidden_layers"])
            n_target = int(d.get("num_target_layers", n_layers))
            hidden = int(d["hidden_size"])
            heads = int(d["num_attention_heads"])
            if "mask_token_id" not in dflash and "mask_token_id" not in d:
                raise KeyError("dflash_config.mask_token_id")
            mask_id = int(dflash.get("mask_token_id", d.get("mask_token_id")))
            layer_ids = dflash.get("target_layer_ids")
            if layer_ids is None:
                layer_ids = default_target_layer_ids(n_target, n_layers)
            layer_types = d.get("layer_types") or ["full_attention"] * n_layers
            window = d.get("sliding_window")
            windows = []
            for t in layer_types:
                if t == "sliding_attention":
                    if not window:
                        raise ConfigError("layer_types has sliding_attention but config.json has no sliding_window")
                    windows.append(int(window))
                elif t == "full_attention":
                    windows.append(None)
                else:
                    raise ConfigError(f"layer type {t!r} is not supported; expected full_attention or sliding_attention")
            cfg = DrafterConfig(
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=n_layers,
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_eps=float(d.get("rms_norm_eps", 1e-6)),
                block_size=int(d.get("block_size", dflash.get("block_size", 16))),
                target_layer_ids=tuple(int(i) for i in layer_ids),
                mask_token_id=mask_id,
                num_target_layers=n_target,
                vocab_size=int(d["vocab_size"]),
                sliding_windows=tuple(windows),
                rope=RopeConfig.from_hf(d),
                qkv_bias=bool(d.get("attention_bias", False)),
            )
        except KeyError as e:
            raise ConfigError(f"drafter config.json lacks the field {e.args[0]!r}") from None
        if len(cfg.sliding_windows) != cfg.num_layers:
            raise ConfigError(
                f"drafter layer_types has {len(cfg.sliding_windows)} entries but num_hidden_layers is {cfg.num_layers}"
            )
        if cfg.block_size < 2:
            raise ConfigError(f"drafter block_size is {cfg.block_size}; it must be at least 2")
        short = [w for w in cfg.sliding_windows if w is not None and w < cfg.block_size]
        if short:
            # The block always sees itself in full; a window shorter than the block would hide
            # part of it, which no DFlash checkpoint does.
            raise ConfigError(f"drafter sliding_window {short[0]} is shorter than block_size {cfg.block_size}; "
                              "windows shorter than the block are not supported")
        return cfg


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's rule when `target_layer_ids` is absent: spread from 1 to L-3; one layer: the middle."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def check_pair(target: TargetConfig, drafter: DrafterConfig) -> None:
    """Raise ConfigError naming every way the drafter does not fit the target."""
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


def read_hf_config(path: str | Path) -> dict[str, Any]:
    return read_json_file(Path(path) / "config.json", error=ConfigError,
                          missing="pass a Hugging Face model directory (with config.json)")


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
