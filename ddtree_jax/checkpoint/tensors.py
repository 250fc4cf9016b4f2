"""safetensors files, read and written one tensor at a time.

The format: an 8-byte little-endian header length, a JSON header naming every tensor's dtype,
shape and byte range, then the raw little-endian bytes. It is read directly (not through
`safetensors.safe_open`: its numpy backend cannot return bfloat16, its flax/torch backends would
pull tensors onto an accelerator or through torch), so every name, dtype and shape is checked
from the headers before any data is read, and a tensor is read alone into a fresh array.

`StreamWriter` writes one: every tensor's shape and dtype are known before the first byte, so the
header goes first and the tensors follow one at a time, each released once written.

`StackedTensor` is a mixture-of-experts param ([E, in, out]) gathered from E stored blocks (one
tensor per expert, or one expert's rows of a fused 3-D tensor): it fills a preallocated array one
expert at a time, so the host holds that array and one expert's block.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable

import ml_dtypes
import numpy as np

from ddtree_jax.errors import UserError

_TILE = 128  # a 128 x 128 tile of the source and of the result stay in cache while it is copied
_TILED_FROM = 1 << 20  # elements: below this numpy's one strided copy is as fast


def swap_last_into(out: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """out[...] = raw with its last two axes swapped, cast to out's dtype. Without a cast numpy's
    strided copy of a whole matrix runs ~3x slower than tile by tile (it misses the cache on every
    element written); its casting loop is fast as it is. Bands of tiles go to threads."""
    *_, r, c = raw.shape
    if raw.size < _TILED_FROM or out.dtype != raw.dtype:
        out[...] = np.swapaxes(raw, -1, -2)
        return out

    def band(i: int) -> None:
        for j in range(0, c, _TILE):
            out[..., j:j + _TILE, i:i + _TILE] = np.swapaxes(raw[..., i:i + _TILE, j:j + _TILE], -1, -2)

    starts = range(0, r, _TILE)
    if _WORKERS <= 1 or len(starts) <= 1:
        for i in starts:
            band(i)
    else:
        list(_pool().map(band, starts))  # numpy's copies release the GIL
    return out


_WORKERS = min(8, os.cpu_count() or 1)
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    """One pool for every transpose of the process (a blocked read transposes ~1,000 blocks)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(_WORKERS, thread_name_prefix="swap_last")
    return _POOL

# Raw bytes a cast or transposed matrix is read in (TensorInfo.load): its largest block beside it.
LOAD_BLOCK_BYTES = 16 * 1024 * 1024
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
        """The tensor as a fresh C-contiguous array, cast to `dtype` and its last two axes swapped
        (a 2-D transpose) if asked.

        Read with plain reads, not a memory map: a file cut short since its header was read is a
        one-line error here, where a mapped page past its end would kill the process (SIGBUS).
        A matrix that is cast or transposed is read LOAD_BLOCK_BYTES of rows at a time into the
        result, so the host holds the result and one block, not the raw tensor beside it."""
        dt = self.np_dtype if dtype is None else np.dtype(dtype)
        if len(self.shape) != 2 or (dt == self.np_dtype and not transpose):
            raw = self.read_block()
            if not transpose:
                return raw if dt == raw.dtype else raw.astype(dt)
            return swap_last_into(np.empty(_swap_last(raw.shape), dt), raw)
        r, c = self.shape
        out = np.empty((c, r) if transpose else (r, c), dt)
        step = max(1, LOAD_BLOCK_BYTES // max(1, c * self.np_dtype.itemsize))
        for r0 in range(0, r, step):
            r1 = min(r, r0 + step)
            raw = self.read_block(rows=(r0, r1))
            if transpose:
                swap_last_into(out[:, r0:r1], raw)
            else:
                out[r0:r1] = raw  # the assignment casts
            del raw
        return out

    def read_block(self, index: int | None = None, rows: tuple[int, int] | None = None) -> np.ndarray:
        """The stored bytes of `tensor[index][rows[0]:rows[1]]` (None: all), a contiguous block
        read alone into a fresh array: one expert of a fused [E, ...] tensor without the others."""
        shape, start = self.shape, 0
        if index is not None:
            if not 0 <= index < shape[0]:
                raise IndexError(f"{self.name}: index {index} outside [0, {shape[0]})")
            shape, start = shape[1:], index * math.prod(shape[1:])
        if rows is not None:
            r0, r1 = rows
            if not 0 <= r0 <= r1 <= shape[0]:
                raise IndexError(f"{self.name}: rows {rows} outside [0, {shape[0]}]")
            start += r0 * math.prod(shape[1:])
            shape = (r1 - r0, *shape[1:])
        raw = np.empty(shape, self.np_dtype)
        try:
            with open(self.file, "rb") as f:
                f.seek(self.offset + start * raw.itemsize)
                got = f.readinto(raw.reshape(-1).view(np.uint8)) if raw.size else 0
        except OSError as e:
            raise UserError(f"cannot read {self.file}: {e.strerror or e}") from None
        if got != raw.nbytes:
            raise UserError(f"{self.file} is not a valid safetensors file (tensor {self.name!r} is cut short; "
                            "truncated?); re-download or re-save it")
        return raw


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
        return _swap_last(self.src.shape) if self.transpose else self.src.shape

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


def _swap_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (*shape[:-2], shape[-1], shape[-2]) if len(shape) >= 2 else shape


@dataclasses.dataclass(frozen=True)
class TensorPart:
    """One expert's block of a stacked param: `src[index][rows[0]:rows[1]]` (None: all of it)."""

    src: TensorInfo
    index: int | None = None
    rows: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        shape = self.src.shape if self.index is None else self.src.shape[1:]
        return shape if self.rows is None else (self.rows[1] - self.rows[0], *shape[1:])


@dataclasses.dataclass(frozen=True)
class StackedTensor:
    """A mixture-of-experts param not read yet: `parts[e]` (cast, its last two axes swapped if
    `transpose`) becomes slice e of one [E, ...] array. Answers like a LazyTensor.

    `load()` preallocates the result and reads one part at a time into its slice, so the host
    holds the result and one expert's block, never the experts twice."""

    parts: tuple[TensorPart, ...]
    to_dtype: np.dtype | None = None
    transpose: bool = False

    @property
    def shape(self) -> tuple[int, ...]:
        one = self.parts[0].shape
        return (len(self.parts), *(_swap_last(one) if self.transpose else one))

    @property
    def dtype(self) -> np.dtype:
        return self.parts[0].src.np_dtype if self.to_dtype is None else np.dtype(self.to_dtype)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def load(self) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        for e, part in enumerate(self.parts):
            raw = part.src.read_block(part.index, part.rows)
            if self.transpose:
                swap_last_into(out[e], raw)
            else:
                out[e] = raw  # the assignment casts
            del raw
        return out

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


# Bytes written between background syncs: large enough that a sync is one long sequential write.
SYNC_BYTES = 256 * 1024 * 1024


class _Syncer:
    """A thread that fdatasyncs `fd` whenever SYNC_BYTES more have been written since its last
    request; an error of a sync is raised on the writer's next call."""

    def __init__(self, fd: int):
        self._fd, self._pending, self._error = fd, 0, None
        self._wake, self._done = threading.Condition(), False
        self._requested = False
        self._thread = threading.Thread(target=self._run, name="StreamWriter-sync", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._requested or self._done)
                if self._done:
                    return
                self._requested = False
            try:
                os.fdatasync(self._fd)
            except OSError as e:
                self._error = e
                return

    def _raise(self) -> None:
        if self._error is not None:
            e, self._error = self._error, None
            raise e

    def wrote(self, nbytes: int) -> None:
        self._raise()
        self._pending += nbytes
        if self._pending >= SYNC_BYTES:
            self._pending = 0
            with self._wake:
                self._requested = True
                self._wake.notify()

    def stop(self, check: bool = True) -> None:
        """End the thread (after the sync in progress, if any); raise a sync's error if `check`."""
        with self._wake:
            self._done = True
            self._wake.notify()
        self._thread.join()
        if check:
            self._raise()


class StreamWriter:
    """Write one safetensors file tensor by tensor, in the order `specs` lists them.

    specs: (name, shape, dtype) of every tensor, known before any data. `write(name, array)` takes
    them in that order and checks each; `close()` checks that every one came and syncs the file to
    disk. Any OSError (a full disk) propagates: the caller removes the partial file.

    The disk writes overlap the caller's reading and casting: every SYNC_BYTES written, a thread
    syncs what is written so far (a host with much memory would otherwise hold it all dirty and
    write it only at the final sync, after the conversion's other work)."""

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
        self._syncer = _Syncer(self._file.fileno())

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
            self._file.flush()
            self._syncer.wrote(a.nbytes)
        self._next += 1

    def close(self) -> None:
        try:
            if self._next != len(self.specs):
                raise ValueError(f"{self.path}: {len(self.specs) - self._next} tensors were never written")
            self._file.flush()
            self._syncer.stop()
            os.fsync(self._file.fileno())
        finally:
            self._syncer.stop(check=False)  # idempotent; an error of its own was raised above
            self._file.close()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._syncer.stop(check=False)
            self._file.close()
