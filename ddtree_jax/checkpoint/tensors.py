"""safetensors files, read and written one tensor at a time.

The format: an 8-byte little-endian header length, a JSON header naming every tensor's dtype,
shape and byte range, then the raw little-endian bytes. It is read directly (not through
`safetensors.safe_open`: its numpy backend cannot return bfloat16, its flax/torch backends would
pull tensors onto an accelerator or through torch), so every name, dtype and shape is checked
from the headers before any data is read, and a tensor is read alone into a fresh array.

`StreamWriter` writes one: every tensor's shape and dtype are known before the first byte, so the
header goes first and the tensors follow one at a time, each released once written.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from pathlib import Path
from typing import Any, Iterable

import ml_dtypes
import numpy as np

from ddtree_jax.errors import UserError

# A header larger than this is not a real header (safetensors itself caps it at 100 MB).
MAX_HEADER = 100 * 1024 * 1024

SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
}
CODES = {dt: code for code, dt in SAFETENSORS_DTYPES.items()}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: its file, dtype and shape (as stored) and byte range."""

    name: str
    file: Path
    dtype: str  # safetensors dtype code, e.g. "BF16"
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in `file`

    @property
    def np_dtype(self) -> np.dtype:
        self.check_dtype()
        return SAFETENSORS_DTYPES[self.dtype]

    def check_dtype(self) -> None:
        """A one-line error for a dtype we do not read (quantized weights), before any data is read."""
        if self.dtype not in SAFETENSORS_DTYPES:
            raise UserError(
                f"{self.file}: tensor {self.name!r} has dtype {self.dtype}; only float checkpoints "
                f"({', '.join(SAFETENSORS_DTYPES)}) are supported, not quantized ones"
            )

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.np_dtype.itemsize

    def read(self) -> np.ndarray:
        """A read-only memory-mapped view of the tensor; copy it before the file goes away."""
        dt = self.np_dtype
        if math.prod(self.shape) == 0:
            return np.zeros(self.shape, dt)
        return np.memmap(self.file, dtype=dt, mode="r", offset=self.offset, shape=self.shape)

    def load(self, dtype: Any = None, transpose: bool = False) -> np.ndarray:
        """The tensor as a fresh C-contiguous array, cast to `dtype` and transposed (2-D) if asked.

        Read with plain reads, not a memory map: a file cut short since its header was read is a
        one-line error here, where a mapped page past its end would kill the process (SIGBUS).
        Holds at most the raw bytes and the result at once."""
        raw = np.empty(self.shape, self.np_dtype)
        try:
            with open(self.file, "rb") as f:
                f.seek(self.offset)
                got = f.readinto(raw.reshape(-1).view(np.uint8)) if raw.size else 0
        except OSError as e:
            raise UserError(f"cannot read {self.file}: {e.strerror or e}") from None
        if got != raw.nbytes:
            raise UserError(f"{self.file} is not a valid safetensors file (tensor {self.name!r} is cut short; "
                            "truncated?); re-download or re-save it")
        dt = raw.dtype if dtype is None else np.dtype(dtype)
        if not transpose and dt == raw.dtype:
            return raw
        return np.array(raw.T if transpose else raw, dtype=dt, order="C")


@dataclasses.dataclass(frozen=True)
class LazyTensor:
    """A param not read yet: its stored tensor and how it becomes ours (cast, transposed).

    `.shape`, `.dtype` and `.ndim` answer without reading; `np.asarray` (or `load()`) reads it.
    Loaders hand these to the device one at a time, so the host never holds the whole model."""

    src: TensorInfo
    to_dtype: np.dtype | None = None
    transpose: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        return self.src.shape[::-1] if self.transpose else self.src.shape

    @property
    def dtype(self) -> np.dtype:
        return self.src.np_dtype if self.to_dtype is None else np.dtype(self.to_dtype)

    @property
    def ndim(self) -> int:
        return len(self.src.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def load(self) -> np.ndarray:
        return self.src.load(self.to_dtype, self.transpose)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = self.load()
        return a if dtype is None else a.astype(dtype, copy=False)


def read_header(file: Path, fix: str = "re-download or re-save it") -> dict[str, TensorInfo]:
    """Parse one safetensors header; any inconsistency is reported as a corrupt file (and `fix`)."""

    def corrupt(why: str) -> UserError:
        return UserError(f"{file} is not a valid safetensors file ({why}); {fix}")

    try:
        size = file.stat().st_size
        with open(file, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise corrupt("file too short")
            (n,) = struct.unpack("<Q", raw)
            if n > min(MAX_HEADER, size - 8):
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


class StreamWriter:
    """Write one safetensors file tensor by tensor, in the order `specs` lists them.

    specs: (name, shape, dtype) of every tensor, known before any data. `write(name, array)` takes
    them in that order and checks each; `close()` checks that every one came and syncs the file to
    disk. Any OSError (a full disk) propagates: the caller removes the partial file."""

    def __init__(self, path: str | Path, specs: Iterable[tuple[str, tuple[int, ...], Any]],
                 metadata: dict[str, str] | None = None):
        self.path = Path(path)
        self.specs = [(name, tuple(int(s) for s in shape), np.dtype(dt)) for name, shape, dt in specs]
        header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
        offset = 0
        for name, shape, dt in self.specs:
            if dt not in CODES:
                raise UserError(f"tensor {name!r}: dtype {dt} cannot be stored; valid: {', '.join(map(str, CODES))}")
            end = offset + math.prod(shape) * dt.itemsize
            header[name] = {"dtype": CODES[dt], "shape": list(shape), "data_offsets": [offset, end]}
            offset = end
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors pads it
        self._next = 0
        self._file = open(self.path, "xb")
        self._file.write(struct.pack("<Q", len(raw)) + raw)

    def write(self, name: str, array: Any) -> None:
        if self._next >= len(self.specs):
            raise ValueError(f"{self.path}: tensor {name!r} is beyond the {len(self.specs)} the header lists")
        want, shape, dt = self.specs[self._next]
        a = np.asarray(array)
        if name != want or a.shape != shape or a.dtype != dt:
            raise ValueError(f"{self.path}: got tensor {name!r} {list(a.shape)} {a.dtype}, the header's next is "
                             f"{want!r} {list(shape)} {dt}")
        a = np.ascontiguousarray(a)
        if a.size:
            self._file.write(memoryview(a.reshape(-1).view(np.uint8)))
        self._next += 1

    def close(self) -> None:
        try:
            if self._next != len(self.specs):
                raise ValueError(f"{self.path}: {len(self.specs) - self._next} tensors were never written")
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()
