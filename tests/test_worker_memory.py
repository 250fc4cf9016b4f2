"""The test workers' guard against XLA:CPU's mapped regions (conftest.release_executables): a
worker that kept every compiled kernel would pass vm.max_map_count and crash compiling."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from conftest import mapped_regions, release_executables


@functools.lru_cache(maxsize=None)
def _compiled(i: int):
    return jax.jit(lambda x: jnp.cumsum(jnp.sin(x) * i, axis=0) + 1).lower(jnp.ones((4, 3))).compile()


def test_release_drops_cached_executables_and_unmaps_their_kernels():
    before = mapped_regions()
    for i in range(24):
        _compiled(i)
    grown = mapped_regions()
    assert grown >= before + 24  # at least a region an executable
    release_executables()
    assert _compiled.cache_info().currsize == 0
    assert mapped_regions() <= grown - 24
