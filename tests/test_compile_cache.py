"""The CLIs' persistent compilation cache: where it lives, how it is turned off, that a second
run reuses it with the same output."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_jax import compile_cache

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("value, expect", [(None, "xdg"), ("off", None), ("0", None), ("", None), ("~/c", "home")])
def test_cache_dir_from_environment(monkeypatch, tmp_path, value, expect):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    if value is None:
        monkeypatch.delenv(compile_cache.ENV, raising=False)
    else:
        monkeypatch.setenv(compile_cache.ENV, value)
    want = {"xdg": tmp_path / "ddtree_jax" / "xla", "home": tmp_path / "h" / "c", None: None}[expect]
    assert compile_cache.cache_dir() == want


def run_generate(env: dict) -> dict:
    cmd = [sys.executable, "-m", "ddtree_jax.generate", "--prompt", "def f(x):", "--max-new-tokens", "12", "--json"]
    p = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_second_run_uses_the_cache(tmp_path):
    # Every executable stored, however fast it compiled: with JAX's default (only those that took
    # >= 1 s) a prefill compiled in ~1 s was stored by one run and not the other, depending on load.
    store_all = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    cache = tmp_path / "cache"
    first = run_generate({compile_cache.ENV: str(cache), **store_all})
    entries = sorted(p.name for p in cache.iterdir())
    assert entries, "nothing was cached"
    second = run_generate({compile_cache.ENV: str(cache), **store_all})
    assert second["token_ids"] == first["token_ids"]
    assert sorted(p.name for p in cache.iterdir()) == entries  # hits: nothing new compiled and stored
    off = run_generate({compile_cache.ENV: "off", "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert off["token_ids"] == first["token_ids"] and not (tmp_path / "xdg").exists()


def test_disabled_jax_cache_is_reported_off(monkeypatch):
    """Where JAX's cache is switched off (as in the test workers) enable() says so."""
    import jax

    assert not jax.config.jax_enable_compilation_cache  # conftest turns it off in test workers
    assert compile_cache.enable() is None
