"""Hugging Face export of the trained pair, and reading an exported target back.

Target: a plain `Qwen3ForCausalLM` directory (config.json, model.safetensors or shards of at most
`max_shard_bytes` with model.safetensors.index.json, generation_config.json, tokenizer files), so
`transformers.AutoModelForCausalLM.from_pretrained` loads it. Drafter: the z-lab DFlash layout
(`DFlashDraftModel`, `dflash_config`, weights without the "model." prefix). Tensor names and
shapes come from ddtree_jax/checkpoint/names.py, the same table `python -m convert` reads with, so export and
conversion cannot drift apart. Our [in, out] matrices are transposed to HF's [out, in].
`export_checkpoint` does the same for a converted checkpoint (the shipped pair is stored only in
that form; tests that compare with transformers rebuild its HF directories from it).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ddtree_jax.errors import UserError
from ddtree_jax.models.config import DrafterConfig, TargetConfig

MAX_SHARD_BYTES = 15 * 1000 * 1000
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _np_dtype(name: str) -> np.dtype:
    from ddtree_jax.checkpoint import resolve_dtype

    return resolve_dtype(name)


def target_hf_config(cfg: TargetConfig, *, dtype: str, eos_id: int, bos_id: int | None = None,
                     pad_id: int | None = None) -> dict[str, Any]:
    if cfg.family != "qwen3" or cfg.rope.kind != "default":
        raise UserError("only Qwen3 targets with default RoPE can be exported")
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope.theta,
        "rope_scaling": None,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg.num_layers,
        "layer_types": ["full_attention"] * cfg.num_layers,
        "bos_token_id": eos_id if bos_id is None else bos_id,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id if pad_id is None else pad_id,
        "torch_dtype": dtype,
        "transformers_version": "4.51.0",
    }


def drafter_hf_config(cfg: DrafterConfig, target: TargetConfig, *, dtype: str) -> dict[str, Any]:
    layer_types = ["full_attention" if w is None else "sliding_attention" for w in cfg.sliding_windows]
    windows = {w for w in cfg.sliding_windows if w is not None}
    if len(windows) > 1:
        raise UserError("the z-lab format has one sliding_window for all layers")
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.max_position,
        "rms_norm_eps": cfg.rms_eps,
        "rope_theta": cfg.rope.theta,
        "rope_scaling": None,
        "attention_bias": cfg.qkv_bias,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "use_sliding_window": bool(windows),
        "sliding_window": next(iter(windows)) if windows else None,
        "layer_types": layer_types,
        "is_causal": False,  # training's block mask is non-causal; without it sliding layers would load causal
        "num_target_layers": cfg.num_target_layers,
        "block_size": cfg.block_size,
        "dflash_config": {"target_layer_ids": list(cfg.target_layer_ids), "mask_token_id": cfg.mask_token_id},
        "torch_dtype": dtype,
    }


def hf_tensors(cfg: TargetConfig | DrafterConfig, params: Any, dtype: str) -> dict[str, np.ndarray]:
    """Our param tree -> {HF name: array in HF layout and `dtype`}, shapes checked against the config."""
    from ddtree_jax.checkpoint.names import check_params, entries_for, get_path

    check_params(cfg, params, where="export")
    dt = _np_dtype(dtype)
    out = {}
    for e in entries_for(cfg):
        a = np.asarray(get_path(params, e.path), np.float32)
        if e.parts:  # stacked experts go out one tensor per expert, the hub's layout
            for part, x in zip(e.parts, a):
                out[part.hf_name] = np.ascontiguousarray((x.T if e.transpose else x).astype(dt))
            continue
        out[e.hf_name] = np.ascontiguousarray((a.T if e.transpose else a).astype(dt))
    return out


def save_safetensors(tensors: dict[str, np.ndarray], out_dir: Path, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """model.safetensors, or model-0000i-of-0000n.safetensors + index when over `max_shard_bytes`."""
    from safetensors.numpy import save_file

    total = sum(a.nbytes for a in tensors.values())
    meta = {"format": "pt"}
    if total <= max_shard_bytes:
        save_file(tensors, str(out_dir / "model.safetensors"), metadata=meta)
        (out_dir / "model.safetensors").chmod(0o644)  # save_file creates it 0600
        return ["model.safetensors"]
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, a in tensors.items():
        if shards[-1] and size + a.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = a
        size += a.nbytes
    n = len(shards)
    weight_map, files = {}, []
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{n:05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata=meta)
        (out_dir / fname).chmod(0o644)
        files.append(fname)
        weight_map.update({k: fname for k in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files + ["model.safetensors.index.json"]


def copy_tokenizer_files(src: Path | None, dst: Path) -> list[str]:
    if src is None:
        return []
    names = [n for n in TOKENIZER_FILES if (src / n).is_file()]
    for n in names:
        shutil.copy2(src / n, dst / n)
    return names


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def export_target(out: str | Path, cfg: TargetConfig, params: Any, *, tokenizer_dir: str | Path | None,
                  eos_id: int, dtype: str = "bfloat16", max_shard_bytes: int = MAX_SHARD_BYTES,
                  force: bool = True) -> Path:
    """Write the HF target directory atomically."""
    from ddtree_jax.checkpoint import atomic_directory

    config = target_hf_config(cfg, dtype=dtype, eos_id=eos_id)
    tensors = hf_tensors(cfg, params, dtype)
    with atomic_directory(out, force) as tmp:
        save_safetensors(tensors, tmp, max_shard_bytes)
        _write_json(tmp / "config.json", config)
        _write_json(tmp / "generation_config.json", {
            "bos_token_id": config["bos_token_id"], "eos_token_id": eos_id, "pad_token_id": config["pad_token_id"],
            "do_sample": False, "transformers_version": "4.51.0"})
        copy_tokenizer_files(Path(tokenizer_dir) if tokenizer_dir else None, tmp)
    return Path(out)


def export_drafter(out: str | Path, cfg: DrafterConfig, params: Any, target: TargetConfig, *,
                   tokenizer_dir: str | Path | None = None, dtype: str = "bfloat16",
                   max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = True) -> Path:
    """Write the z-lab DFlash drafter directory atomically."""
    from ddtree_jax.checkpoint import atomic_directory

    config = drafter_hf_config(cfg, target, dtype=dtype)
    tensors = hf_tensors(cfg, params, dtype)
    with atomic_directory(out, force) as tmp:
        save_safetensors(tensors, tmp, max_shard_bytes)
        _write_json(tmp / "config.json", config)
        copy_tokenizer_files(Path(tokenizer_dir) if tokenizer_dir else None, tmp)
    return Path(out)


def export_checkpoint(ckpt: str | Path, out: str | Path, *, dtype: str | None = None,
                      max_shard_bytes: int = MAX_SHARD_BYTES, force: bool = False) -> tuple[Path, Path | None]:
    """A converted checkpoint (ddtree_jax.checkpoint) back in Hugging Face form, atomically:
    out/target (transformers' AutoModelForCausalLM loads it) and, with a drafter, out/draft (z-lab
    DFlash), each with the checkpoint's tokenizer files. Each config.json is the one the checkpoint
    kept from its conversion; the weights are its params in `dtype` (default: the checkpoint's),
    so a bfloat16 checkpoint comes back bit for bit. Returns (target dir, draft dir or None)."""
    from ddtree_jax.checkpoint import atomic_directory, copy_tokenizer, load_checkpoint

    ck = load_checkpoint(ckpt)
    dtype = dtype or ck.meta["dtype"]
    with atomic_directory(out, force) as tmp:
        models = [("target", ck.target_cfg, ck.target_params)]
        if ck.drafter_cfg is not None:
            models.append(("draft", ck.drafter_cfg, ck.drafter_params))
        for name, cfg, params in models:
            d = tmp / name
            d.mkdir()
            save_safetensors(hf_tensors(cfg, params, dtype), d, max_shard_bytes)
            config = json.loads((Path(ck.path) / name / "config.json").read_text())
            for key in ("torch_dtype", "dtype"):
                if key in config:
                    config[key] = dtype
            _write_json(d / "config.json", config)
            copy_tokenizer(ck.tokenizer_dir, d)
    out = Path(out)
    return out / "target", (out / "draft" if ck.drafter_cfg is not None else None)
