"""Reading Hugging Face model directories: config.json and safetensors weights.

The safetensors format is read directly (8-byte header length, JSON header, raw little-endian
data) rather than through `safetensors.safe_open`: its numpy backend cannot return bfloat16, and
its flax/torch backends would pull tensors onto an accelerator or through torch. Reading the
header ourselves also lets every name, dtype and shape be checked before any tensor data is
touched, and a tensor is then one `np.memmap` view, so conversion holds one tensor at a time.
"""
from __future__ import annotations

import dataclasses
import json
import math
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ddtree_jax.errors import UserError
from ddtree_jax.models.config import read_hf_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# A header larger than this is not a real header (safetensors itself caps it at 100 MB).
_MAX_HEADER = 100 * 1024 * 1024

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype and shape (HF layout) and byte range."""

    name: str
    file: Path
    dtype: str  # safetensors dtype code, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in `file`

    def read(self) -> np.ndarray:
        """A read-only memory-mapped view of the tensor; copy it before the file goes away."""
        if self.dtype not in SAFETENSORS_DTYPES:
            raise UserError(
                f"{self.file}: tensor {self.name!r} has dtype {self.dtype}; only float checkpoints "
                f"({', '.join(SAFETENSORS_DTYPES)}) are supported, not quantized ones"
            )
        dt = SAFETENSORS_DTYPES[self.dtype]
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, dt)
        return np.memmap(self.file, dtype=dt, mode="r", offset=self.offset, shape=self.shape)


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


def read_header(file: Path) -> dict[str, TensorInfo]:
    """Parse one safetensors header; any inconsistency is reported as a corrupt file."""

    def corrupt(why: str) -> UserError:
        return UserError(f"{file} is not a valid safetensors file ({why}); re-download or re-save it")

    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise corrupt("file too short")
            (n,) = struct.unpack("<Q", raw)
            if n > min(_MAX_HEADER, size - 8):
                raise corrupt("header unreadable")
            header = json.loads(f.read(n))
    except OSError as e:
        raise UserError(f"cannot read {file}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise corrupt("header unreadable") from None
    if not isinstance(header, dict):
        raise corrupt("header unreadable")
    data_start, data_len = 8 + n, size - 8 - n
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(s) for s in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise corrupt(f"bad header entry for {name!r}") from None
        if not 0 <= begin <= end <= data_len:
            raise corrupt(f"tensor {name!r} lies outside the file; truncated?")
        itemsize = SAFETENSORS_DTYPES[dtype].itemsize if dtype in SAFETENSORS_DTYPES else None
        if itemsize is not None and (end - begin) != math.prod(shape) * itemsize:
            raise corrupt(f"tensor {name!r} has {end - begin} bytes for shape {list(shape)} {dtype}")
        out[name] = TensorInfo(name, file, dtype, shape, data_start + begin)
    return out


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
