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
"""
from __future__ import annotations

import os
from pathlib import Path

ENV = "DDTREE_COMPILE_CACHE"


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
    return path
