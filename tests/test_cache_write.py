"""ddtree_jax.kernels.cache_write: every layer's cache write in one kernel (interpret mode) against
the per-layer XLA path and numpy, for per-layer and stacked caches; its CUDA lowering; the engine
with it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels import cache_write as cw
from tests.test_kernels import _verified_triton_modules


def arrays(rng, n, bt, hkv, s, t, dh, cache_dtype, new_dtype):
    caches = [jnp.asarray(rng.standard_normal((bt, hkv, s, dh)), cache_dtype) for _ in range(n)]
    news = [jnp.asarray(rng.standard_normal((bt, t, hkv, dh)), new_dtype) for _ in range(n)]
    return caches, news


@pytest.mark.parametrize("n,bt,hkv,s,t,p,dh,cache_dtype,new_dtype,groups", [
    (1, 1, 1, 16, 1, 1, 16, jnp.float32, jnp.float32, 0),          # AR: one row
    (4, 2, 2, 64, 17, 8, 32, jnp.bfloat16, jnp.bfloat16, 0),       # a tree's path, ragged batch
    (5, 3, 2, 40, 9, 9, 16, jnp.bfloat16, jnp.float32, 0),         # cast into the cache dtype
    (9, 1, 1, 128, 65, 17, 64, jnp.float32, jnp.float32, 0),       # a program per array
    (9, 2, 1, 48, 9, 5, 16, jnp.float32, jnp.float32, 4),          # arrays 0, 4, 8 in one program
])
def test_kernel_matches_xla(n, bt, hkv, s, t, p, dh, cache_dtype, new_dtype, groups):
    rng = np.random.default_rng(n * 100 + t)
    caches, news = arrays(rng, n, bt, hkv, s, t, dh, cache_dtype, new_dtype)
    start = jnp.asarray(rng.integers(0, s - p + 1, size=bt), jnp.int32)
    rows = jnp.asarray(rng.integers(0, t, size=(bt, p)), jnp.int32)
    got = cw.write_cache_rows(caches, news, start, rows, impl="pallas_interpret", groups=groups)
    want = cw.write_cache_rows_reference(caches, news, start, rows)
    for g, w, c in zip(got, want, caches):
        assert g.dtype == c.dtype and g.shape == c.shape
        np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    # the rows outside [start, start + p) are the old cache's
    for g, c in zip(got, caches):
        for b in range(bt):
            lo = int(start[b])
            keep = np.r_[0:lo, lo + p:s]
            np.testing.assert_array_equal(np.asarray(g[b][:, keep], np.float32), np.asarray(c[b][:, keep], np.float32))


@pytest.mark.parametrize("groups", [0, 2])
def test_stacked_new_arrays(groups):
    """One stacked [Bt, T, n, Hkv, Dh] array (array j at [:, :, j]) writes what the list does."""
    rng = np.random.default_rng(5)
    caches, news = arrays(rng, 6, 2, 2, 32, 7, 16, jnp.bfloat16, jnp.float32)
    start = jnp.array([0, 25], jnp.int32)
    rows = jnp.broadcast_to(jnp.arange(7, dtype=jnp.int32), (2, 7))
    stacked = jnp.stack(news, axis=2)
    want = cw.write_cache_rows_reference(caches, news, start, rows)
    for impl in ("pallas_interpret", "xla"):
        got = cw.write_cache_rows(caches, stacked, start, rows, impl=impl, groups=groups)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    with pytest.raises(ValueError, match=r"stacked new arrays must be \[Bt, T, 6, Hkv, Dh\]"):
        cw.write_cache_rows(caches, stacked[:, :, :5], start, rows)


def test_falls_back_and_checks():
    rng = np.random.default_rng(0)
    caches, news = arrays(rng, 2, 1, 1, 200, 100, 16, jnp.float32, jnp.float32)
    rows = jnp.arange(100, dtype=jnp.int32)[None]          # a prompt's rows: more than MAX_ROWS
    got = cw.write_cache_rows(caches, news, jnp.zeros(1, jnp.int32), rows, impl="pallas_interpret")
    want = cw.write_cache_rows_reference(caches, news, jnp.zeros(1, jnp.int32), rows)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    with pytest.raises(ValueError, match="unknown cache-write impl"):
        cw.write_cache_rows(caches, news, jnp.zeros(1, jnp.int32), rows, impl="cuda")
    with pytest.raises(ValueError, match="2 cache layers but 1 new arrays"):
        cw.write_cache_rows(caches, news[:1], jnp.zeros(1, jnp.int32), rows)
    with pytest.raises(ValueError, match=r"give \[Bt, Hkv, S, Dh\] or \[L, Bt, Hkv, S, Dh\]"):
        cw.write_cache_rows([caches[0][0]], news[:1], jnp.zeros(1, jnp.int32), rows)


def numpy_write(caches, news, start, rows):
    """The contract by loops: slot j (the caches' layers in order) gets news[j][b, rows[b, p]] at
    row start[b] + p, cast to its cache's dtype; every other row keeps its old value."""
    out = [np.array(np.asarray(c, np.float32)) for c in caches]
    slots = [(o, layer, c.dtype) for o, c in zip(out, caches) for layer in range(o.shape[0] if o.ndim == 5 else 1)]
    for (o, layer, dtype), new in zip(slots, news, strict=True):
        o5 = o if o.ndim == 5 else o[None]
        cast = np.asarray(jnp.asarray(new).astype(dtype), np.float32)
        for b in range(rows.shape[0]):
            for q, r in enumerate(np.asarray(rows[b])):
                o5[layer, b, :, int(start[b]) + q] = cast[b, r]
    return out


def assert_writes(got, caches, want):
    for g, c, w in zip(got, caches, want, strict=True):
        assert g.shape == c.shape and g.dtype == c.dtype
        np.testing.assert_array_equal(np.asarray(g, np.float32), w)


@pytest.mark.parametrize("cache_dtype,groups", [(jnp.bfloat16, 0), (jnp.float32, 2)])
def test_stacked_caches(cache_dtype, groups):
    """Two stacked caches [L=3, Bt, Hkv, S, Dh] (K's then V's: 6 slots), new arrays as a list and
    stacked [Bt, T, 6, Hkv, Dh]: the kernel, XLA's path and numpy agree bit for bit."""
    rng = np.random.default_rng(7 + groups)
    bt, hkv, s, t, p, dh = 2, 2, 40, 9, 5, 16
    caches = [jnp.asarray(rng.standard_normal((3, bt, hkv, s, dh)), cache_dtype) for _ in range(2)]
    news = [jnp.asarray(rng.standard_normal((bt, t, hkv, dh)), jnp.float32) for _ in range(6)]
    start = jnp.array([0, s - p], jnp.int32)          # the first and the last rows a write can reach
    rows = jnp.asarray(rng.integers(0, t, size=(bt, p)), jnp.int32)
    want = numpy_write(caches, news, start, rows)
    for given in (news, jnp.stack(news, axis=2)):
        assert_writes(cw.write_cache_rows_reference(caches, given, start, rows), caches, want)
        assert_writes(cw.write_cache_rows(caches, given, start, rows, impl="pallas_interpret", groups=groups),
                      caches, want)
    with pytest.raises(ValueError, match="6 cache layers but 5 new arrays"):
        cw.write_cache_rows(caches, news[:5], start, rows)
    with pytest.raises(ValueError, match="groups=-1"):
        cw.write_cache_rows(caches, news, start, rows, impl="pallas_interpret", groups=-1)


@pytest.mark.parametrize("with_rows", [True, False])
def test_xla_path_writes_a_stacked_cache_in_one_scatter(with_rows):
    """XLA's path writes all layers of a stacked cache with one scatter, the layer axis inside the
    window: a layer index would be a constant a layer, and XLA compiles such writes once a layer
    (the 8B prefill's 72 writes). Prompt writes (rows None) too, also at the last
    rows a window can reach."""
    sds = jax.ShapeDtypeStruct
    caches = [sds((36, 2, 4, 64, 16), jnp.bfloat16)] * 2
    news = sds((2, 8, 72, 4, 16), jnp.float32)
    rows = (sds((2, 5), jnp.int32),) if with_rows else ()

    def write(c, n, s, *r):
        return cw.write_cache_rows_reference(c, n, s, r[0] if r else None)

    text = jax.jit(write).trace(caches, news, sds((2,), jnp.int32), *rows).lower().as_text()
    assert text.count('"stablehlo.scatter"') == 2                # one a cache array, for 36 layers
    rng = np.random.default_rng(5)
    small = [jnp.asarray(rng.standard_normal((3, 2, 2, 24, 16)), jnp.float32) for _ in range(2)]
    new = [jnp.asarray(rng.standard_normal((2, 6, 2, 16)), jnp.float32) for _ in range(6)]
    start = jnp.array([0, 24 - 6], jnp.int32)
    every = jnp.broadcast_to(jnp.arange(6, dtype=jnp.int32), (2, 6))
    assert_writes(cw.write_cache_rows_reference(small, new, start, None), small, numpy_write(small, new, start, every))


def test_per_layer_and_stacked_caches_in_one_call():
    """A 4-D cache (one slot, float32) before a stacked bf16 one (two slots): slot order and each
    cache's dtype hold; layers of different shapes take XLA's path."""
    rng = np.random.default_rng(3)
    bt, hkv, s, t, p, dh = 2, 1, 24, 6, 3, 32
    caches = [jnp.asarray(rng.standard_normal((bt, hkv, s, dh)), jnp.float32),
              jnp.asarray(rng.standard_normal((2, bt, hkv, s, dh)), jnp.bfloat16)]
    news = [jnp.asarray(rng.standard_normal((bt, t, hkv, dh)), jnp.float32) for _ in range(3)]
    start = jnp.array([4, 11], jnp.int32)
    rows = jnp.array([[5, 0, 2], [1, 1, 4]], jnp.int32)
    want = numpy_write(caches, news, start, rows)
    assert_writes(cw.write_cache_rows(caches, jnp.stack(news, axis=2), start, rows, impl="pallas_interpret"),
                  caches, want)
    assert_writes(cw.write_cache_rows(caches, news, start, rows, impl="xla"), caches, want)
    longer = [caches[0], jnp.concatenate([caches[1], caches[1]], axis=3)]     # S = 24 and 48
    assert cw._unsupported(longer, news, rows)
    assert_writes(cw.write_cache_rows(longer, news, start, rows, impl="pallas_interpret"), longer,
                  numpy_write(longer, news, start, rows))


@pytest.mark.skipif(cw.pltriton is None, reason="this jax has no Pallas Triton lowering")
def test_triton_lowering_72_arrays(monkeypatch):
    """The Qwen3-8B commit: two stacked bf16 caches [36, 1, 8, 1280, 128] (K, V), 72 new arrays and
    a 16-row path, one kernel."""
    modules = _verified_triton_modules(monkeypatch)
    sds = jax.ShapeDtypeStruct
    caches = [sds((36, 1, 8, 1280, 128), jnp.bfloat16)] * 2
    news = [sds((1, 65, 8, 128), jnp.bfloat16)] * 72
    try:
        jax.jit(lambda c, n, s, r: cw.write_cache_rows(c, n, s, r, impl="pallas")).trace(
            caches, news, sds((1,), jnp.int32), sds((1, 16), jnp.int32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


def test_engine_with_the_kernel_is_lossless(monkeypatch):
    """The commit's target and drafter cache writes through the kernel (interpret mode): DDTree
    gives the XLA path's AR tokens, batch rows of different lengths."""
    traced = []
    real = cw._write_pallas
    monkeypatch.setattr(cw, "_write_pallas",
                        lambda c, *a, **k: traced.append(tuple(x.shape[0] for x in c)) or real(c, *a, **k))
    from ddtree_jax.generator import Generator
    from tiny import tiny_pair

    pair = tiny_pair(vocab=64, layers=2)
    # tiny_pair's head dim (8) is below the kernel's 16: a pair with a 16-wide head
    import dataclasses
    from ddtree_jax.models.init import init_drafter, init_target
    tc = dataclasses.replace(pair.target_cfg, head_dim=16)
    dc = dataclasses.replace(pair.drafter_cfg, head_dim=16)
    pair.target_cfg, pair.drafter_cfg = tc, dc
    pair.target_params = init_target(tc, jax.random.PRNGKey(0))
    pair.drafter_params = init_drafter(dc, jax.random.PRNGKey(1))
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(2, 33))]
    want = [r.token_ids for r in Generator(pair, method="ar", cache_impl="xla").generate_ids(prompts, max_new_tokens=24)]
    gen = Generator(pair, method="ddtree", budget=24, cache_impl="pallas_interpret")
    assert [r.token_ids for r in gen.generate_ids(prompts, max_new_tokens=24)] == want
    # traced: the commit's target and drafter writes, each into two stacked caches (K and V)
    assert traced == [(tc.num_layers,) * 2, (dc.num_layers,) * 2], traced


def test_auto_takes_the_kernel_where_the_attention_kernels_run():
    """"auto": the kernel on NVIDIA GPUs (measured faster there), XLA's path elsewhere; "triton"
    is "pallas"; the kernel module takes explicit impls only."""
    from ddtree_jax.kernels import dispatch
    from ddtree_jax.tuning import CPU_KERNELS, GPU_KERNELS

    assert dispatch.cache_choice(GPU_KERNELS) == "pallas" and dispatch.cache_choice(CPU_KERNELS) == "xla"
    assert dispatch.cache_choice(GPU_KERNELS.with_impls(cache="xla")) == "xla"
    assert dispatch.cache_choice(CPU_KERNELS.with_impls(cache="pallas_interpret")) == "pallas_interpret"
    assert cw.resolve_impl("triton") == "pallas" and cw.resolve_impl("pallas_interpret") == "pallas_interpret"
    with pytest.raises(ValueError, match="unknown cache-write impl"):
        cw.resolve_impl("cuda")
    with pytest.raises(ValueError, match="chosen per device"):
        cw.resolve_impl("auto")
