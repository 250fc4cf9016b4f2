"""pallas_kernels.attention: Pallas kernel (interpret mode) vs plain-JAX reference vs float64 numpy.

CPU only. Sizes are chosen so the whole file runs in well under three minutes on two cores:
most prefixes are short, one case per tree size family uses S = 4096.
"""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from pallas_kernels import (KernelConfig, attention, attention_reference,  # noqa: E402
                            auto_impl, auto_impl_for_kind, available_impls)

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


# ----------------------------------------------------------------------------- helpers

def random_tree_mask(rng, t: int) -> np.ndarray:
    """Ancestor-or-self mask of a random tree: node 0 is the root, parent[i] < i."""
    parent = np.full(t, -1)
    parent[1:] = [rng.integers(0, i) for i in range(1, t)]
    mask = np.eye(t, dtype=bool)
    for i in range(1, t):
        mask[i] |= mask[parent[i]]
    return mask


def make_inputs(seed, *, bt=2, t, s, hkv, g, dh, dtype, cache_len, kv_start=None,
                mask_kind="tree", poison=np.nan):
    rng = np.random.default_rng(seed)
    hq = hkv * g

    def rnd(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q, k_new, v_new = rnd(bt, t, hq, dh), rnd(bt, t, hkv, dh), rnd(bt, t, hkv, dh)
    k_cache, v_cache = rnd(bt, hkv, s, dh), rnd(bt, hkv, s, dh)
    # Round through the input dtype so that the float64 reference sees the same numbers.
    q, k_new, v_new, k_cache, v_cache = (
        np.array(jnp.asarray(x, dtype).astype(jnp.float32))
        for x in (q, k_new, v_new, k_cache, v_cache))
    cache_len = np.asarray(cache_len, np.int32)
    starts = np.zeros(bt, np.int32) if kv_start is None else np.asarray(kv_start, np.int32)
    for b in range(bt):  # poison everything that must stay invisible
        for arr in (k_cache, v_cache):
            arr[b, :, cache_len[b]:] = poison
            arr[b, :, :starts[b]] = poison
    if mask_kind == "tree":
        new_mask = np.stack([random_tree_mask(rng, t) for _ in range(bt)])
    elif mask_kind == "causal":
        new_mask = np.broadcast_to(np.tril(np.ones((t, t), bool)), (bt, t, t)).copy()
    else:
        new_mask = np.ones((bt, t, t), bool)
    args = dict(q=q, k_new=k_new, v_new=v_new, k_cache=k_cache, v_cache=v_cache,
                cache_len=cache_len, new_mask=new_mask,
                kv_start=None if kv_start is None else starts)
    jargs = {k: (None if v is None else jnp.asarray(v, dtype) if v.dtype == np.float32
                 else jnp.asarray(v)) for k, v in args.items()}
    return args, jargs


def numpy_reference(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, scale):
    """Float64, one batch row and query head at a time, from the definition."""
    bt, t, hq, dh = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    out = np.zeros((bt, t, hq, dh))
    for b in range(bt):
        lo = 0 if kv_start is None else int(kv_start[b])
        hi = int(cache_len[b])
        for h in range(hq):
            kh = h // g
            keys = np.concatenate([k_cache[b, kh, lo:hi], k_new[b, :, kh]]).astype(np.float64)
            vals = np.concatenate([v_cache[b, kh, lo:hi], v_new[b, :, kh]]).astype(np.float64)
            sc = q[b, :, h].astype(np.float64) @ keys.T * scale        # [T, P + T]
            vis = np.concatenate([np.ones((t, keys.shape[0] - t), bool), new_mask[b]], axis=1)
            sc = np.where(vis, sc, -np.inf)
            p = np.exp(sc - sc.max(1, keepdims=True))
            out[b, :, h] = (p / p.sum(1, keepdims=True)) @ vals
    return out


def rel_err(out, ref) -> float:
    out = np.asarray(jnp.asarray(out, jnp.float32), np.float64)
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))


def run_both(jargs, scale, config=None):
    """(XLA reference, Pallas kernel in interpret mode), each under one jit (one compile)."""
    pos = [jargs[k] for k in ("q", "k_new", "v_new", "k_cache", "v_cache", "cache_len",
                              "new_mask")]
    ref = jax.jit(functools.partial(attention, scale=scale, impl="xla"))(
        *pos, kv_start=jargs["kv_start"])
    ker = jax.jit(functools.partial(attention, scale=scale, impl="pallas_interpret",
                                    config=config))(*pos, kv_start=jargs["kv_start"])
    return ref, ker


# ----------------------------------------------------------------------------- cases

# (T, S, cache_len per row, kv_start or None, Hkv, G, Dh, dtype, mask kind)
CASES = [
    (1, 1, (0, 1), None, 2, 1, 64, jnp.float32, "tree"),         # decode, empty prefix row
    (1, 100, (100, 37), None, 2, 4, 128, jnp.bfloat16, "tree"),
    (1, 4096, (4096, 3001), None, 1, 8, 128, jnp.bfloat16, "tree"),
    (16, 100, (100, 0), None, 2, 4, 64, jnp.float32, "tree"),
    (16, 130, (129, 1), None, 1, 8, 128, jnp.bfloat16, "tree"),  # not a block multiple
    (16, 4096, (4096, 2500), (1000, 0), 1, 1, 64, jnp.float32, "tree"),
    (16, 40, (40, 40), None, 2, 4, 64, jnp.bfloat16, "all"),       # drafter block
    (65, 100, (1, 100), None, 2, 1, 128, jnp.float32, "tree"),
    (65, 4096, (4096, 2049), None, 1, 4, 128, jnp.bfloat16, "tree"),
    (65, 77, (77, 50), None, 1, 8, 64, jnp.float32, "causal"),     # prefill-style
    (257, 33, (33, 5), None, 1, 1, 64, jnp.float32, "tree"),
    (257, 64, (0, 64), None, 1, 4, 64, jnp.bfloat16, "tree"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: (
    f"T{c[0]}-S{c[1]}-len{c[2][0]}_{c[2][1]}-G{c[5]}-D{c[6]}-"
    f"{jnp.dtype(c[7]).name}-{c[8]}{'-win' if c[3] else ''}"))
def test_attention_matches_references(case):
    t, s, lens, starts, hkv, g, dh, dtype, mask_kind = case
    scale = dh ** -0.5
    args, jargs = make_inputs(CASES.index(case), t=t, s=s, hkv=hkv, g=g, dh=dh, dtype=dtype,
                              cache_len=lens, kv_start=starts, mask_kind=mask_kind)
    want = numpy_reference(**args, scale=scale)
    ref, ker = run_both(jargs, scale)
    for name, out in (("xla", ref), ("pallas", ker)):
        assert out.shape == args["q"].shape and out.dtype == dtype, name
        assert not np.isnan(np.asarray(out, np.float32)).any(), f"{name} produced NaN"
        assert rel_err(out, want) < TOL[dtype], (name, rel_err(out, want))
    assert rel_err(ker, np.asarray(ref, np.float64)) < TOL[dtype]


@pytest.mark.parametrize("poison", [np.nan, np.inf, 3e38])
def test_stale_cache_never_leaks(poison):
    """Entries past cache_len and before kv_start hold garbage: the output must not see them."""
    args, jargs = make_inputs(7, t=16, s=200, hkv=2, g=4, dh=64, dtype=jnp.float32,
                              cache_len=(150, 3), kv_start=(20, 0), poison=poison)
    want = numpy_reference(**args, scale=0.125)
    ref, ker = run_both(jargs, 0.125)
    for out in (ref, ker):
        assert np.isfinite(np.asarray(out)).all()
        assert rel_err(out, want) < TOL[jnp.float32]


def test_kv_start_window_and_empty_windows():
    """kv_start cuts the prefix; kv_start >= cache_len leaves only the new tokens."""
    args, jargs = make_inputs(11, t=8, s=256, hkv=1, g=4, dh=64, dtype=jnp.float32,
                              cache_len=(256, 100), kv_start=(129, 100))
    want = numpy_reference(**args, scale=0.125)
    ref, ker = run_both(jargs, 0.125)
    assert rel_err(ref, want) < 1e-5 and rel_err(ker, want) < 1e-5
    # Row 1 sees no prefix at all: same as attention over the new block alone.
    no_prefix = numpy_reference(**{**args, "cache_len": np.zeros(2, np.int32)}, scale=0.125)
    assert np.abs(np.asarray(ker)[1] - no_prefix[1]).max() < 1e-5


def test_small_blocks_and_many_splits():
    """Explicit tiny tiles: many row blocks, chunks and a ragged last chunk."""
    args, jargs = make_inputs(3, t=9, s=333, hkv=1, g=4, dh=64, dtype=jnp.float32,
                              cache_len=(333, 170), kv_start=(5, 0))
    cfg = KernelConfig(block_m=16, block_k=16, num_splits=7)
    want = numpy_reference(**args, scale=0.125)
    _, ker = run_both(jargs, 0.125, config=cfg)
    assert rel_err(ker, want) < 1e-5


def test_traced_cache_len_one_compile():
    """cache_len and kv_start are traced: one jit serves every length."""
    args, jargs = make_inputs(5, t=4, s=96, hkv=1, g=2, dh=64, dtype=jnp.float32,
                              cache_len=(96, 96))
    calls = []

    @jax.jit
    def f(cache_len, kv_start):
        calls.append(1)
        return attention(jargs["q"], jargs["k_new"], jargs["v_new"], jargs["k_cache"],
                         jargs["v_cache"], cache_len, jargs["new_mask"], scale=0.125,
                         kv_start=kv_start, impl="pallas_interpret")

    for lens, starts in (((96, 10), (0, 0)), ((1, 50), (0, 20)), ((0, 0), (0, 0))):
        lens, starts = np.asarray(lens, np.int32), np.asarray(starts, np.int32)
        out = f(jnp.asarray(lens), jnp.asarray(starts))
        want = numpy_reference(**{**args, "cache_len": lens, "kv_start": starts}, scale=0.125)
        assert rel_err(out, want) < 1e-5
    assert len(calls) == 1


def test_impl_selection():
    assert auto_impl_for_kind("cpu", platform="cpu") == "xla"
    assert auto_impl_for_kind("TPU v5 lite", platform="tpu") == "xla"
    assert auto_impl_for_kind("NVIDIA H200", platform="gpu", compute_capability="9.0") in (
        "pallas", "xla")
    assert auto_impl_for_kind("Tesla V100-SXM2-16GB", platform="gpu",
                              compute_capability="7.0") == "xla"
    assert auto_impl_for_kind("AMD Instinct MI300X", platform="gpu") == "xla"
    if jax.devices()[0].platform == "cpu":
        assert auto_impl() == "xla"
        assert "pallas" not in available_impls() and "pallas_interpret" in available_impls()
    with pytest.raises(ValueError, match="unknown attention impl"):
        attention(*[None] * 7, scale=1.0, impl="cuda")


def test_reference_rejects_bad_shapes():
    _, j = make_inputs(1, t=4, s=8, hkv=2, g=2, dh=64, dtype=jnp.float32, cache_len=(8, 8))
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_reference(j["q"][:, :, :3], j["k_new"], j["v_new"], j["k_cache"],
                            j["v_cache"], j["cache_len"], j["new_mask"], scale=1.0)
