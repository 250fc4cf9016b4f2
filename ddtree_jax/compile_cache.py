"""JAX's persistent compilation cache for the command-line tools.

Compiling the prefill and the round loop is most of a short run's wall time (on a Qwen3-8B-sized
model 10-80 s per method on the H200, bench/RESULTS.md; ~12 s of a 19 s CPU run of the shipped
pair). With the cache a second run with the same shapes loads the executables from disk.

    DDTREE_COMPILE_CACHE unset     -> $XDG_CACHE_HOME/ddtree_jax/xla (default ~/.cache/ddtree_jax/xla)
    DDTREE_COMPILE_CACHE=DIR       -> DIR
    DDTREE_COMPILE_CACHE=off       -> no persistent cache (also "0" or empty)

A cache directory the user set through JAX itself (`jax_compilation_cache_dir`) wins. Entries
are keyed by JAX on the computation, the compile options, the device and the JAX version, so a
stale entry is never used for different code; only executables that took >= 1 s to compile are
stored. Two runs sharing the directory at once are safe: a half-written entry fails JAX's
decompression, which JAX reports as a warning and answers by compiling.

JAX's cache still traces and lowers every executable to compute its key (11.6 s of a 22.7 s
cold start at the 8B shape on an H100). The Generator's executables are therefore also kept
whole in `executables/` beside it, keyed by what the Generator compiles them from (argument
shapes and dtypes, the static configs, the XLA options) plus this package's source, the JAX
version, the XLA flags and the devices: a hit loads the executable without tracing.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from pathlib import Path

ENV = "DDTREE_COMPILE_CACHE"
PACKAGE = Path(__file__).resolve().parent
_executables: Path | None = None  # where whole executables go once `enable` found a cache directory


def cache_dir() -> Path | None:
    """The directory the tools would use, or None when disabled."""
    value = os.environ.get(ENV)
    if value is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return Path(base) / "ddtree_jax" / "xla"
    if value.strip().lower() in ("", "0", "off", "no", "false"):
        return None
    return Path(value).expanduser()


def enable() -> Path | None:
    """Point JAX's persistent cache at `cache_dir()` unless JAX already has one; returns the
    directory in use (None: no cache). An unwritable directory disables the cache quietly."""
    import jax

    if not jax.config.jax_enable_compilation_cache:
        return None
    current = jax.config.jax_compilation_cache_dir
    if current:
        _use_executables(Path(current))
        return Path(current)
    path = cache_dir()
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(path, os.W_OK):
        return None
    jax.config.update("jax_compilation_cache_dir", str(path))
    _use_executables(path)
    return path


def _use_executables(path: Path) -> None:
    global _executables
    try:
        (path / "executables").mkdir(exist_ok=True)
        _executables = path / "executables"
    except OSError:
        _executables = None


def disable_executables() -> None:
    """Stop keeping whole executables (JAX's own cache stays as it is)."""
    global _executables
    _executables = None


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """A hash of the package's code and kernel tables: an executable traced from other code is another entry."""
    h = hashlib.sha256()
    for f in sorted(PACKAGE.rglob("*")):
        if f.suffix in (".py", ".json") and "default_model" not in f.parts and f.is_file():
            h.update(str(f.relative_to(PACKAGE)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def executable_key(what) -> str | None:
    """The file name of the executable compiled from `what` (a repr-stable description of its
    inputs), or None when executables are not kept (no cache directory)."""
    if _executables is None:
        return None
    import jax
    import jaxlib

    devices = [(d.platform, d.device_kind, d.id) for d in jax.devices()]
    parts = (what, source_fingerprint(), jax.__version__, jaxlib.__version__, os.environ.get("XLA_FLAGS", ""),
             jax.config.jax_enable_x64, jax.config.jax_default_matmul_precision, devices)
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def load_executable(key: str | None):
    """The executable stored under `key` (jax.stages.Compiled), or None: none stored, or one that
    does not load (half written, another jaxlib), which the caller answers by compiling."""
    if key is None or _executables is None:
        return None
    path = _executables / f"{key}.pkl"
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        from jax.experimental import serialize_executable

        return serialize_executable.deserialize_and_load(*pickle.loads(blob))
    except Exception:  # noqa: BLE001 - a bad entry only costs the compile it would have saved
        return None


def store_executable(key: str | None, compiled) -> None:
    """Keep `compiled` under `key`, written whole (a temporary file renamed into place); a
    failure (disk full, an executable that does not serialize) only loses the entry."""
    if key is None or _executables is None:
        return
    tmp = None
    try:
        from jax.experimental import serialize_executable

        blob = pickle.dumps(serialize_executable.serialize(compiled))
        fd, tmp = tempfile.mkstemp(dir=_executables, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, _executables / f"{key}.pkl")
        tmp = None
    except Exception:  # noqa: BLE001
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
