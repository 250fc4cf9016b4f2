"""The record file: one `.npz` (zip, deflate) with a JSON header, written to a temporary sibling
and renamed into place (a failure or Ctrl-C leaves nothing), read back with every shape checked.
`record.py` says what it holds and how it is computed; numpy only here, so a bad file is refused
before JAX starts.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import zipfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ddtree_jax.errors import UserError

FORMAT = 1
# Bytes of each checkpoint file's head and tail that its fingerprint reads (sizes cover the rest).
FINGERPRINT_BYTES = 1 << 20
ARRAYS = ("prompt_ids", "prompt_offsets", "outputs", "logp", "ids")
HEADER_INTS = ("block_size", "depth", "vocab_size", "top_k", "max_new_tokens")


@dataclasses.dataclass
class Record:
    """A loaded record; arrays on the host. `header` is the file's JSON header."""

    header: dict
    prompts: list[np.ndarray]  # int32 [L_i] each
    outputs: np.ndarray  # int32 [P, N + D]
    logp: np.ndarray  # float32 [P, N - 1, D, K]
    ids: np.ndarray  # int32 / uint16 [P, N - 1, D, K]

    @property
    def depth(self) -> int:
        return int(self.header["depth"])

    @property
    def top_k(self) -> int:
        return int(self.header["top_k"])

    @property
    def max_new_tokens(self) -> int:
        return int(self.header["max_new_tokens"])

    @property
    def stop_ids(self) -> list[int]:
        return [int(t) for t in self.header["stop_ids"]]

    @property
    def num_prompts(self) -> int:
        return len(self.prompts)


def fingerprint(ckpt_dir: str | Path) -> str:
    """A converted checkpoint's identity: a hash of its models' files (ddtree.json, target/,
    draft/: not the tokenizer or a README), each file's path, size, first and last MiB (cheap on a
    16 GB checkpoint; another model or a re-conversion changes it)."""
    root = Path(ckpt_dir)
    files = [root / "ddtree.json"] + [p for d in ("target", "draft") for p in (root / d).rglob("*")]
    h = hashlib.sha256()
    for path in sorted(p for p in files if p.is_file()):
        size = path.stat().st_size
        h.update(f"{path.relative_to(root).as_posix()}\0{size}\0".encode())
        with open(path, "rb") as f:
            h.update(f.read(FINGERPRINT_BYTES))
            if size > FINGERPRINT_BYTES:
                f.seek(max(FINGERPRINT_BYTES, size - FINGERPRINT_BYTES))
                h.update(f.read())
    return h.hexdigest()[:24]


# ----------------------------------------------------------------------------- the file


@contextlib.contextmanager
def atomic_file(path: str | Path, force: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of `path` that is renamed onto it when the block completes; on
    any exception or Ctrl-C it is removed and `path` is untouched. An existing `path` is refused
    unless `force`."""
    path = Path(path)
    if (path.exists() or path.is_symlink()) and not force:
        raise UserError(f"{path} already exists; pass --force to replace it, or choose another output file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_record(path: str | Path, header: dict, prompts: Sequence[Sequence[int]], outputs: np.ndarray,
                logp: np.ndarray, ids: np.ndarray, *, force: bool = False) -> Path:
    """Write a record atomically (see `atomic_file`)."""
    lens = np.asarray([len(p) for p in prompts], np.int64)
    arrays = {
        "header": np.frombuffer(json.dumps(header).encode(), np.uint8),
        "prompt_ids": np.concatenate([np.asarray(p, np.int32) for p in prompts]),
        "prompt_offsets": np.concatenate([[0], np.cumsum(lens)]),
        "outputs": outputs, "logp": logp, "ids": ids,
    }
    with atomic_file(path, force) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)
    return Path(path)


def load_record(path: str | Path) -> Record:
    """A record written by `save_record`; one UserError line for a missing or malformed file."""
    path = Path(path)
    redo = f"record one with python -m ddtree_jax.research record --out {path}"
    if not path.is_file():
        raise UserError(f"record {path} not found; {redo}")
    try:
        z = np.load(path, allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise UserError(f"{path} is a single array, not a research record; {redo}")
        with z:
            missing = [k for k in ("header",) + ARRAYS if k not in z.files]
            if missing:
                raise UserError(f"{path} is not a research record (no {', '.join(missing)}); {redo}")
            header = json.loads(z["header"].tobytes().decode())
            arrays = {k: z[k] for k in ARRAYS}
    except UserError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a readable research record ({type(e).__name__}: {str(e)[:80]}); "
                        f"{redo}") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise UserError(f"{path} has record format {header.get('format') if isinstance(header, dict) else None!r}, "
                        f"this version reads format {FORMAT}; {redo}")
    absent = [k for k in HEADER_INTS if not isinstance(header.get(k), int)]
    if absent or not isinstance(header.get("checkpoint"), dict) or not isinstance(header.get("stop_ids"), list):
        raise UserError(f"{path} has a damaged header ({', '.join(absent) or 'checkpoint, stop_ids'}); {redo}")
    offsets = arrays["prompt_offsets"]
    prompts = [arrays["prompt_ids"][a:b] for a, b in zip(offsets[:-1], offsets[1:])]
    rec = Record(header, prompts, arrays["outputs"], arrays["logp"], arrays["ids"])
    p, n, d, k = len(prompts), rec.max_new_tokens, rec.depth, rec.top_k
    want = {"outputs": (p, n + d), "logp": (p, n - 1, d, k), "ids": (p, n - 1, d, k)}
    bad = [f"{name} {arrays[name].shape} (expected {shape})" for name, shape in want.items()
           if arrays[name].shape != shape]
    if bad or not p:
        raise UserError(f"{path} is inconsistent: {'; '.join(bad) or 'no prompts'}; {redo}")
    return rec


def check_checkpoint(rec: Record, ckpt_dir: str | Path, where: str) -> None:
    """Refuse a record made with another checkpoint than `ckpt_dir`."""
    want = rec.header["checkpoint"]["fingerprint"]
    if fingerprint(ckpt_dir) != want:
        raise UserError(f"record {where} was made with checkpoint {rec.header['checkpoint']['path']} "
                        f"(fingerprint {want}), not {ckpt_dir}; record it again with --ckpt {ckpt_dir}")
