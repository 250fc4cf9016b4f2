"""Reading Hugging Face model directories: config.json and safetensors weights (ddtree_jax/checkpoint/tensors.py).

`HFModel` checks a directory completely from its config and the safetensors headers (every name,
dtype and shape, through the name table) before any data is read, and hands its tensors over as
`LazyTensor`s in our layout: converted (python -m convert) or loaded straight (generate --target).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ddtree_jax.checkpoint import names
from ddtree_jax.checkpoint.tensors import (SAFETENSORS_DTYPES, LazyTensor, StackedTensor, TensorInfo, TensorPart,
                                          read_header)
from ddtree_jax.drafters.dflash2 import drafter_config_from_hf
from ddtree_jax.errors import UserError
from ddtree_jax.models.config import DrafterConfig, TargetConfig, read_hf_config
from ddtree_jax.models.family import target_config_from_hf
from ddtree_jax.models.hybrid import HybridConfig

__all__ = ["SAFETENSORS_DTYPES", "TensorInfo", "read_header", "read_config", "weight_files", "scan", "HFModel",
           "is_hf_dir"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_config(model_dir: str | Path, what: str) -> dict[str, Any]:
    """config.json of a HF model directory, with one-line errors naming `what` (--target/--draft)."""
    d = Path(model_dir)
    if not d.exists():
        raise UserError(f"{what} directory {d} not found; pass a Hugging Face model directory")
    if not d.is_dir():
        raise UserError(f"{what} {d} is not a directory; pass a Hugging Face model directory")
    return read_hf_config(d)


def weight_files(model_dir: str | Path) -> tuple[list[Path], dict[str, str] | None]:
    """The safetensors files of a model and, when sharded, the index's name -> file map."""
    d = Path(model_dir)
    index = d / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            if not isinstance(weight_map, dict):
                raise TypeError
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{index} is not a valid safetensors index (no 'weight_map'); re-download it") from None
        files = [d / f for f in dict.fromkeys(weight_map.values())]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise UserError(f"{index} lists {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} which "
                            f"{'is' if len(missing) == 1 else 'are'} missing from {d}; re-download the checkpoint")
        return files, weight_map
    single = d / SINGLE_FILE
    if single.is_file():
        return [single], None
    hint = ""
    if list(d.glob("*.bin")) or list(d.glob("*.pt")):
        hint = ("; PyTorch .bin checkpoints are not supported: re-save with "
                "save_pretrained(..., safe_serialization=True)")
    raise UserError(f"{d} has no {SINGLE_FILE} or {INDEX_FILE}{hint}")


def scan(model_dir: str | Path) -> dict[str, TensorInfo]:
    """Every tensor of a HF model directory (headers only; no data is read)."""
    files, weight_map = weight_files(model_dir)
    tensors: dict[str, TensorInfo] = {}
    for f in files:
        for name, info in read_header(f).items():
            if name in tensors:
                raise UserError(f"tensor {name!r} is in both {tensors[name].file.name} and {f.name}; "
                                "the checkpoint is inconsistent")
            tensors[name] = info
    if weight_map is not None:
        for name, fname in weight_map.items():
            if name not in tensors or tensors[name].file.name != fname:
                raise UserError(f"{Path(model_dir) / INDEX_FILE} places {name!r} in {fname}, but that file "
                                "does not hold it; re-download the checkpoint")
    return tensors


def is_hf_dir(path: str | Path) -> bool:
    """A Hugging Face model directory: config.json beside safetensors weights."""
    d = Path(path)
    return (d / "config.json").is_file() and ((d / SINGLE_FILE).is_file() or (d / INDEX_FILE).is_file())


class HFModel:
    """One HF model (a target or a z-lab DFlash or DFlash 2 drafter): its config, its tensors and
    the name mapping. Construction reads config.json alone; `scan()` reads the safetensors headers and
    checks every name, dtype and shape against the config (names.match), still no data."""

    def __init__(self, model_dir: str | Path, what: str, kind: str):
        self.dir = Path(model_dir).absolute()
        self.what = what
        self.kind = kind
        self.raw = read_config(self.dir, what)
        where = str(self.dir / "config.json")
        self.cfg: TargetConfig | HybridConfig | DrafterConfig = (
            target_config_from_hf(self.raw, where=where) if kind == "target"
            else drafter_config_from_hf(self.raw, where=where))
        self.entries = names.entries_for(self.cfg)
        self.tensors: dict[str, TensorInfo] = {}
        self.mapping: dict[str, str] = {}

    def scan(self) -> HFModel:
        self.tensors = scan(self.dir)
        skip = None
        if isinstance(self.cfg, HybridConfig):  # the text model's names, its vision tower skipped
            self.entries = names.hybrid_entries(self.cfg, names.hybrid_prefix(self.tensors),
                                                fused=names.fused_expert_layers(self.tensors))
            skip = names.SKIPPED_HYBRID
            skipped = sum(1 for n in self.tensors if skip.search(n))
            if skipped:
                print(f"note: {self.dir}: {skipped} vision / multi-token-prediction tensors skipped; the text model "
                      "alone is read", file=sys.stderr)
        elif self.kind == "target" and self.cfg.moe is not None:  # each MoE layer's experts: per expert or fused
            self.entries = names.target_entries(self.cfg, fused=names.fused_expert_layers(self.tensors))
        self.mapping = names.match(
            self.entries, {n: t.shape for n, t in self.tensors.items()}, where=str(self.dir),
            tied=self.kind == "target" and self.cfg.tie_embeddings,
            strip_prefix="model." if self.kind == "drafter" else None, skip=skip)
        for stored in self.mapping.values():
            self.tensors[stored].check_dtype()
        return self

    def source(self, e: names.Entry, dtype: Any = None) -> LazyTensor | StackedTensor:
        """Entry `e`'s tensor in our layout ([in, out] matrices), cast to `dtype` (None: as stored);
        an expert param is stacked from its E blocks as it is read."""
        dt = None if dtype is None else np.dtype(dtype)
        if e.parts:
            return StackedTensor(tuple(TensorPart(self.tensors[self.mapping[p.hf_name]], p.index, p.rows)
                                       for p in e.parts), dt, e.transpose)
        return LazyTensor(self.tensors[self.mapping[e.hf_name]], dt, e.transpose)

    def lazy_params(self, dtype: Any = None) -> dict[str, Any]:
        """The param tree (names.py's layout) of LazyTensors: nothing is read until a loader asks."""
        params = names.empty_tree(self.cfg)
        for e in self.entries:
            names.set_path(params, e.path, self.source(e, dtype))
        return params
