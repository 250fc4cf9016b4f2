"""pallas_kernels.rank_count: the pairwise-count rank kernel (interpret mode) equals the pairwise
reference (ties, -inf, signed zeros, ragged P, any block sizes), is a permutation, lowers for
CUDA; and ddtree's selections through it (ddtree.RANK_IMPL) are those of the default paths."""
from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.trees import ddtree, make_policy
from pallas_kernels.rank_count import rank_by_count, rank_by_count_reference
from test_kernels import _verified_triton_modules

ROOT = Path(__file__).resolve().parent.parent
I32 = np.iinfo(np.int32)
KINDS = ("float", "ties", "neginf", "zeros")


def make(kind, shape, seed):
    """scores f32 and distinct keys i32 per row (the extremes of int32 included when they fit)."""
    rng = np.random.default_rng(seed)
    bt, p = shape
    s = rng.normal(size=shape).astype(np.float32)
    if kind == "ties":  # a few distinct values: most comparisons are decided by the key
        s = np.round(s).astype(np.float32)
    elif kind == "neginf":  # ties at -inf with the padding's score
        s = np.where(rng.random(shape) < 0.4, -np.inf, np.round(s * 2) / 2).astype(np.float32)
    elif kind == "zeros":  # -0.0 == +0.0: ties, broken by the key
        s = np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(np.float32)
    keys = np.empty(shape, np.int32)
    for b in range(bt):
        pool = np.unique(np.concatenate([rng.integers(I32.min, I32.max, size=2 * p + 4, dtype=np.int64),
                                         [I32.min, I32.max, 0, -1]]))  # INT32_MAX: the padding's key
        keys[b] = rng.permutation(pool)[:p]
    return jnp.asarray(s), jnp.asarray(keys)


@functools.lru_cache(maxsize=None)
def kernel(block_i, block_j):
    return jax.jit(functools.partial(rank_by_count, impl="pallas_interpret", block_i=block_i, block_j=block_j))


@pytest.mark.parametrize("bt,p,block_i,block_j", [
    (1, 1, None, None), (3, 7, None, None), (3, 100, 32, 16), (1, 300, None, None),
    (3, 300, 64, 256), (1, 129, 1, 128)])
def test_rank_by_count_equals_the_pairwise_reference(bt, p, block_i, block_j):
    fn = kernel(block_i, block_j)
    for n, kind in enumerate(KINDS):
        s, k = make(kind, (bt, p), seed=p * 7 + bt + n)
        got = np.asarray(fn(s, k))
        want = np.asarray(rank_by_count_reference(s, k))
        assert got.dtype == np.int32 and got.shape == (bt, p)
        np.testing.assert_array_equal(got, want, err_msg=kind)
        np.testing.assert_array_equal(np.sort(got, axis=1), np.broadcast_to(np.arange(p), (bt, p)))


def test_rank_by_count_order_and_signed_zeros():
    # (score desc, key asc); -0.0 ties +0.0; -inf last, ordered by key
    s = jnp.asarray([[0.0, -np.inf, -0.0, 1.0, -np.inf, -0.0]], jnp.float32)
    k = jnp.asarray([[5, 2, 3, 9, 1, 4]], jnp.int32)
    want = [[3, 5, 1, 0, 4, 2]]
    np.testing.assert_array_equal(np.asarray(kernel(None, None)(s, k)), want)
    np.testing.assert_array_equal(np.asarray(rank_by_count(s, k, impl="xla")), want)


def test_rank_by_count_empty_and_errors():
    assert rank_by_count(jnp.zeros((2, 0)), jnp.zeros((2, 0), jnp.int32), impl="pallas_interpret").shape == (2, 0)
    s, k = jnp.zeros((1, 8)), jnp.arange(8, dtype=jnp.int32)[None]
    with pytest.raises(ValueError, match="unknown rank_by_count impl"):
        rank_by_count(s, k, impl="cuda")
    with pytest.raises(ValueError, match="power of two"):
        rank_by_count(s, k, impl="pallas_interpret", block_j=48)
    with pytest.raises(ValueError, match="int32"):
        rank_by_count(s, k.astype(jnp.float32), impl="pallas_interpret")
    with pytest.raises(ValueError, match=r"\[Bt, P\]"):
        rank_by_count(s, k[:, :4], impl="pallas_interpret")


@pytest.mark.parametrize("bt,p,block_i,block_j", [(1, 7100, None, None), (3, 5, None, None), (2, 1000, 64, 256)])
def test_rank_by_count_triton_lowering_verifies(monkeypatch, bt, p, block_i, block_j):
    """The kernel lowers for CUDA (budget 1024's ~7100 candidates a depth; a row shorter than a
    block; other blocks) and its Triton module verifies, on a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    fn = functools.partial(rank_by_count, impl="pallas", block_i=block_i, block_j=block_j)
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((bt, p), jnp.float32),
                          jax.ShapeDtypeStruct((bt, p), jnp.int32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


# ----------------------------------------------------------------------------- ddtree wiring


def test_default_rank_impl_keeps_the_xla_pairwise_comparison(monkeypatch):
    """RANK_IMPL absent: the counting branch is today's pairwise comparison (no Pallas call)."""
    monkeypatch.setitem(ddtree.RANK_BY_COUNT_MAX, jax.default_backend(), 4096)
    monkeypatch.delitem(ddtree.RANK_IMPL, jax.default_backend(), raising=False)
    s, k = make("ties", (2, 50), seed=1)
    assert "pallas_call" not in str(jax.make_jaxpr(lambda a, b: ddtree.select_best(a, b, 10))(s, k))
    assert "pallas_call" not in str(jax.make_jaxpr(lambda b: ddtree._lex_rank(b))(k))
    monkeypatch.setitem(ddtree.RANK_IMPL, jax.default_backend(), "pallas_interpret")
    assert "pallas_call" in str(jax.make_jaxpr(lambda a, b: ddtree.select_best(a, b, 10))(s, k))
    assert "pallas_call" in str(jax.make_jaxpr(lambda b: ddtree._lex_rank(b))(k))


def test_select_best_and_lex_rank_through_the_kernel_equal_the_sort(monkeypatch):
    backend = jax.default_backend()
    s, k = make("neginf", (3, 300), seed=6)  # ties, many at -inf
    monkeypatch.setitem(ddtree.RANK_BY_COUNT_MAX, backend, 0)  # the sort branch
    monkeypatch.delitem(ddtree.RANK_IMPL, backend, raising=False)
    want_sel, want_lex = ddtree.select_best(s, k, 40), ddtree._lex_rank(k)
    monkeypatch.setitem(ddtree.RANK_BY_COUNT_MAX, backend, 4096)  # the counting branch, by the kernel
    monkeypatch.setitem(ddtree.RANK_IMPL, backend, "pallas_interpret")
    sel = jax.jit(lambda a, b: ddtree.select_best(a, b, 40))(s, k)
    np.testing.assert_array_equal(np.asarray(sel), np.asarray(want_sel))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda b: ddtree._lex_rank(b))(k)), np.asarray(want_lex))


def test_best_first_tree_through_the_kernel_is_the_default_tree(monkeypatch):
    backend = jax.default_backend()
    logp = np.asarray(jax.nn.log_softmax(jnp.asarray(
        np.random.default_rng(3).integers(0, 3, size=(2, 4, 50)), jnp.float32), axis=-1))  # ties

    def tree():
        built = jax.jit(lambda x: make_policy("ddtree").build(x, 24))(jnp.asarray(logp))  # traced now
        return {f.name: np.asarray(getattr(built, f.name)) for f in dataclasses.fields(built)}

    monkeypatch.setitem(ddtree.RANK_BY_COUNT_MAX, backend, 4096)
    monkeypatch.delitem(ddtree.RANK_IMPL, backend, raising=False)
    want = tree()
    monkeypatch.setitem(ddtree.RANK_IMPL, backend, "pallas_interpret")
    got = tree()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_rank_impl_env_sets_every_backend():
    code = "from ddtree_jax.trees import ddtree; print(sorted(ddtree.RANK_IMPL.items()))"
    env = {**os.environ, "DDTREE_RANK_IMPL": "pallas", "JAX_PLATFORMS": "cpu"}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[('cpu', 'pallas'), ('gpu', 'pallas'), ('tpu', 'pallas')]"


def test_rank_impl_values_name_the_kernel_tiles():
    """A RANK_IMPL value is an impl, optionally with the kernel's tiles (BIxBJ[xWARPS])."""
    from ddtree_jax.trees import ddtree
    assert ddtree.rank_impl_args("xla") == {"impl": "xla"}
    assert ddtree.rank_impl_args("pallas:64x256") == {"impl": "pallas", "block_i": 64, "block_j": 256}
    assert ddtree.rank_impl_args("pallas:64x256x8") == {"impl": "pallas", "block_i": 64, "block_j": 256,
                                                        "num_warps": 8}
    for bad in ("cuda", "pallas:64", "pallas:axb", "xla:8x8", "pallas:1x2x3x4"):
        with pytest.raises(ValueError, match="rank impl"):
            ddtree.rank_impl_args(bad)
