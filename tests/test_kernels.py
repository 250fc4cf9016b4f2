"""ddtree_jax.kernels.attention: Pallas kernel (interpret mode) vs plain-JAX reference vs float64 numpy.

CPU only. Sizes are chosen so the whole file runs in well under three minutes on two cores:
most prefixes are short, one case per tree size family uses S = 4096. The GPU path is also
lowered for CUDA (Triton dialect) and its modules verified, which needs no GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.extend.core as jax_core  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from conftest import xla_default_emitters  # noqa: E402

from bench.bench_kernels import random_tree_mask  # noqa: E402
from ddtree_jax.kernels import KernelConfig, attention, attention_reference, dispatch  # noqa: E402
from ddtree_jax.tuning import CPU_KERNELS, GPU_KERNELS, kernel_tuning_for  # noqa: E402
from ddtree_jax.kernels.tree_attention import (_num_splits, _pack_mask, attention_pallas,  # noqa: E402
                                           default_config, launch_plan)

TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1e-2}


# ----------------------------------------------------------------------------- helpers

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
    (1, 300, (300, 77), None, 1, 6, 256, jnp.bfloat16, "tree"),   # Qwen3.5's gated attention: Dh 256
    (65, 150, (150, 90), None, 1, 6, 256, jnp.bfloat16, "tree"),
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


# (T, S, cache_len, kv_start, Hkv, G, config): the one-kernel path (num_splits=1) on a long
# prefix, the merged path on short ones, runtime chunks over a cache larger than its prefix
# (some parts get no key), sliding windows, and new-key steps smaller than T (packed mask words).
PATH_CASES = [
    (1, 700, (700, 9), None, 2, 4, KernelConfig(16, 64, num_splits=1)),
    (1, 700, (700, 9), (650, 20), 2, 4, KernelConfig(16, 64, num_splits=5)),  # row 1: empty
    (9, 300, (300, 120), (17, 119), 2, 3, KernelConfig(32, 32, num_splits=1)),
    (9, 300, (64, 300), (0, 250), 2, 3, KernelConfig(32, 32, num_splits=6)),
    (9, 1000, (70, 999), (30, 500), 1, 2, KernelConfig(16, 64, num_splits=8)),
    (40, 128, (128, 3), None, 1, 2, KernelConfig(64, 32, num_splits=3, block_new=16)),
    (70, 96, (96, 50), (10, 49), 1, 1, KernelConfig(64, 32, num_splits=2, block_new=32)),
    (70, 96, (96, 50), None, 1, 2, KernelConfig(32, 64, num_splits=1, block_new=64,
                                                 split_edges=False)),
]


@pytest.mark.parametrize("case", PATH_CASES, ids=lambda c: (
    f"T{c[0]}-S{c[1]}-G{c[5]}-splits{c[6].num_splits}{'-win' if c[3] else ''}"
    f"{'-bn' + str(c[6].block_new) if c[6].block_new else ''}"))
def test_single_kernel_and_merged_paths(case):
    t, s, lens, starts, hkv, g, cfg = case
    args, jargs = make_inputs(100 + PATH_CASES.index(case), t=t, s=s, hkv=hkv, g=g, dh=64,
                              dtype=jnp.float32, cache_len=lens, kv_start=starts)
    plan = launch_plan(2, t, hkv, g, 64, s, cfg)
    assert plan.kernels == (1 if cfg.num_splits == 1 else 2)
    want = numpy_reference(**args, scale=0.125)
    _, ker = run_both(jargs, 0.125, config=cfg)
    assert rel_err(ker, want) < 1e-5


@pytest.mark.parametrize("num_splits", [1, 2])
def test_skipping_empty_new_key_steps_is_exact(monkeypatch, num_splits):
    """skip_empty: a new-key step that no row of a block may see is skipped. A tree's rows see
    only their ancestors, so at T = 257 with 32-key steps most blocks skip most steps; the
    output is the same bit for bit (a skipped step would leave acc, max and sum unchanged),
    and it is the reference's. The GPU path branches once per step (scf.if around its loads
    and products)."""
    t, s, hkv, g, dh = 257, 40, 1, 4, 64
    args, jargs = make_inputs(7, t=t, s=s, hkv=hkv, g=g, dh=dh, dtype=jnp.float32, cache_len=(40, 3))
    # A deep chain on top of a random tree: some blocks of rows see keys far above the diagonal.
    mask = args["new_mask"]
    mask[:, 200:, :] = np.tril(np.ones((t, t), bool))[200:]
    jargs["new_mask"] = jnp.asarray(mask)
    cfg = KernelConfig(64, 32, num_splits=num_splits, block_new=32)
    with xla_default_emitters():  # two programs compared bit for bit
        outs = [run_both(jargs, 0.125, config=dataclasses.replace(cfg, skip_empty=skip))[1]
                for skip in (True, False)]
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))
    assert rel_err(outs[0], numpy_reference(**{**args, "new_mask": mask}, scale=0.125)) < 1e-5

    counts = []
    for skip in (True, False):
        modules = _verified_triton_modules(monkeypatch)
        sds = jax.ShapeDtypeStruct
        shapes = (sds((1, t, hkv * g, dh), jnp.bfloat16), sds((1, t, hkv, dh), jnp.bfloat16),
                  sds((1, t, hkv, dh), jnp.bfloat16), sds((1, hkv, 512, dh), jnp.bfloat16),
                  sds((1, hkv, 512, dh), jnp.bfloat16), sds((1,), jnp.int32), sds((1, t, t), jnp.bool_))
        fn = functools.partial(attention, scale=0.125, impl="pallas",
                               config=dataclasses.replace(cfg, skip_empty=skip))
        try:
            jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
        except RuntimeError as e:  # pragma: no cover - depends on the installed jax
            pytest.skip(f"cannot lower for CUDA here: {e}")
        assert modules[0].operation.verify()
        counts.append(str(modules[0]).count("scf.if"))
    assert counts[0] - counts[1] == -(-t // 32)


def test_skip_rule():
    """skip_empty=None skips from SKIP_MIN_STEPS new-key steps (H200: a loss at 3, a gain at 9);
    True / False force it; one step never skips (every row sees itself)."""
    from ddtree_jax.kernels.tree_attention import SKIP_MIN_STEPS, _skips
    auto = KernelConfig()
    assert not _skips(auto, 257, 128) and _skips(auto, 1025, 128)
    assert _skips(auto, 128 * SKIP_MIN_STEPS, 128) and not _skips(auto, 128 * (SKIP_MIN_STEPS - 1), 128)
    assert _skips(dataclasses.replace(auto, skip_empty=True), 257, 128)
    assert not _skips(dataclasses.replace(auto, skip_empty=False), 1025, 128)
    assert not _skips(dataclasses.replace(auto, skip_empty=True), 65, 128)


@pytest.mark.parametrize("t,g", [(1, 4), (16, 2), (65, 1)])
def test_empty_prefix_cache(t, g):
    """S = 0: the kernel gets no cache at all and attends to the new tokens only."""
    args, jargs = make_inputs(21 + t, t=t, s=0, hkv=2, g=g, dh=64, dtype=jnp.float32,
                              cache_len=(0, 0))
    want = numpy_reference(**args, scale=0.125)
    ref, ker = run_both(jargs, 0.125)
    assert rel_err(ref, want) < 1e-5 and rel_err(ker, want) < 1e-5


def _pallas_jaxpr(jargs, config=None):
    pos = [jargs[k] for k in ("q", "k_new", "v_new", "k_cache", "v_cache", "cache_len",
                              "new_mask")]
    return jax.make_jaxpr(functools.partial(attention_pallas, scale=0.125, interpret=True,
                                            config=config))(*pos, kv_start=jargs["kv_start"])


@pytest.mark.parametrize("t,s,num_splits", [(1, 300, 1), (1, 4096, None), (9, 100, 1),
                                            (65, 4096, None)])
def test_kernels_per_call(t, s, num_splits):
    """One pallas_call (two with the merge); the only other ops are free reshapes and the
    mask packing, which reads new_mask alone (so a forward's layers share it)."""
    _, jargs = make_inputs(1, t=t, s=s, hkv=2, g=4, dh=64, dtype=jnp.bfloat16,
                           cache_len=(s, 1), kv_start=(0, 0))
    cfg = None if num_splits is None else KernelConfig(16, 64, num_splits=num_splits)
    jaxpr = _pallas_jaxpr(jargs, cfg).jaxpr
    mask_var = jaxpr.invars[6]
    from_mask = {mask_var}
    calls, consts = 0, set()
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        ins = [v for v in eqn.invars if not isinstance(v, jax_core.Literal) and v not in consts]
        if name == "pallas_call":
            calls += 1
        elif not ins:
            consts.update(eqn.outvars)      # made of constants: the cache's layer index
        elif all(v in from_mask for v in ins):
            from_mask.update(eqn.outvars)
        else:
            assert name == "reshape", f"an XLA op on layer data: {eqn}"
    plan = launch_plan(2, t, 2, 4, 64, s, cfg or default_config(t, 4, 64))
    assert calls == plan.kernels == (1 if plan.num_splits == 1 else 2)
    assert (len(from_mask) > 1) == (t > 1)      # T = 1 needs no mask at all


@pytest.mark.parametrize("t", [2, 31, 32, 33, 70])
def test_pack_mask(t):
    rng = np.random.default_rng(t)
    mask = rng.random((2, t, t)) < 0.5
    bits = np.asarray(_pack_mask(jnp.asarray(mask))).view(np.uint32)
    assert bits.shape == (2, t, -(-t // 32))
    unpacked = (bits[..., :, None] >> np.arange(32, dtype=np.uint32)) & 1
    assert (unpacked.reshape(2, t, -1)[..., :t] == mask).all()
    assert not unpacked.reshape(2, t, -1)[..., t:].any()


def test_split_heuristic():
    cfg = KernelConfig()
    assert _num_splits(cfg, 0, 8) == 1
    assert _num_splits(cfg, 2 * cfg.min_chunk - 1, 8) == 1     # short cache: one kernel
    assert _num_splits(cfg, 4096, 8) == 4096 // cfg.min_chunk   # decode, 8 kv heads
    assert _num_splits(cfg, 1 << 20, 8) == -(-cfg.target_programs // 8)  # fill the GPU
    assert _num_splits(cfg, 4096, 10_000) == 1                 # the rows fill the GPU
    assert _num_splits(KernelConfig(num_splits=7), 4096, 8) == 7
    assert _num_splits(KernelConfig(block_k=64, num_splits=7), 100, 8) == 2   # <= key blocks
    capped = KernelConfig(target_programs=256, min_chunk=64, max_chunk=512)
    assert [_num_splits(capped, s, 8) for s in (100, 1024, 4096, 16384, 32768)] == [1, 16, 32, 32, 64]
    assert _num_splits(capped, 32768, 32) == 8    # batch 4: the rows fill the GPU, no max_chunk cut


def test_float32_keeps_small_tiles():
    """float32 (TF32x3 dots) never gets the 128x128 two-warpgroup tiles of large bf16 trees."""
    assert default_config(257, 4, 128).block_m == 128
    for t in (17, 65, 257, 1025):
        cfg = default_config(t, 2, 64, itemsize=4)
        assert (cfg.block_m, cfg.block_k, cfg.num_warps) == (64, 64, 4)
    # Dh = 128 float32 on 3 stages asked for 262144 bytes of shared memory against an H100's /
    # H200's 232448; 2 stages compiled and ran. Decode in float32: 32-key blocks on 2 stages (its
    # bf16 tiles were 8x slower in float32).
    for t in (16, 65, 257):
        assert default_config(t, 4, 128, itemsize=4).num_stages == 2
        assert default_config(t, 4, 64, itemsize=4).num_stages == 3
        assert default_config(t, 4, 128).num_stages == 3
    for dh in (64, 128):
        cfg = default_config(1, 4, dh, itemsize=4)
        assert (cfg.block_k, cfg.num_stages) == (32, 2)
        assert (default_config(1, 4, dh).block_k, default_config(1, 4, dh).num_stages) == (64, 3)


def test_wide_heads_take_the_float32_tiles():
    """bf16 at Dh = 256 (Qwen3.5: 24 query / 4 kv heads) asked an H100 for 262144 bytes of
    shared memory on the bf16 tiles at T = 1 and 65: its rows are float32's bytes at Dh = 128,
    so it takes those tiles, which ran (every T, decode to a 1025-token tree)."""
    for t in (1, 16, 65, 257, 1025):
        wide, f32 = default_config(t, 6, 256), default_config(t, 6, 128, itemsize=4)
        assert (wide.block_m, wide.block_k, wide.num_warps, wide.num_stages) == \
            (f32.block_m, f32.block_k, f32.num_warps, f32.num_stages), t
        assert wide.num_stages == 2 and wide.block_k <= 64


@pytest.mark.parametrize("t,s,splits", [(1, 1024, 16), (1, 2048, 32), (1, 4096, 32), (1, 8192, 32),
                                        (1, 16384, 32), (1, 32768, 64), (65, 4096, 4),
                                        (65, 32768, 14), (257, 4096, 4), (257, 32768, 8)])
def test_default_splits_for_an_8b_layer(t, s, splits):
    """The chunk counts the H200 split sweeps chose (default_config's docstring), Hq=32, Hkv=8."""
    assert launch_plan(1, t, 8, 4, 128, s, default_config(t, 4, 128)).num_splits == splits


@pytest.mark.parametrize("s,width", [(512, 128), (1024, 64), (4096, 32), (32768, 16)])
def test_decode_merge_width_for_an_8b_layer(s, width):
    """Decode's merge takes 2048 elements a program (1.5 against 4096's 2.4 us at 512 keys, a tie
    from 4k): columns of a kv head's 512 per program, by the parts padded to a power of 2."""
    assert launch_plan(1, 1, 8, 4, 128, s, default_config(1, 4, 128)).merge_width == width


def test_tuned_table_overrides_the_default_tiles(tmp_path):
    """An entry of a tile table for this device kind replaces the fields it names (the rest stay
    default_config's), only for its T range, G, head dim and itemsize; a table read from a file
    is checked, a malformed entry or a missing file a one-line error naming the file."""
    from ddtree_jax.kernels import tree_attention as ta
    table = {"NVIDIA H200": [{"t": [60, 70], "g": 4, "dh": 128, "config": {"num_splits": 1, "block_m": 32}}],
             "other": [{"t": [1, 9999], "g": 4, "dh": 128, "config": {"block_k": 16}}]}
    path = tmp_path / "attn.json"
    path.write_text(json.dumps(table))
    read = ta.attention_table(path)
    assert read == table

    def tuned(*a, **k):
        return ta.tuned_attention_config(*a, **k, table=read)

    cfg = tuned(65, 4, 128, device_kind="NVIDIA H200")
    assert cfg == dataclasses.replace(default_config(65, 4, 128), num_splits=1, block_m=32)
    assert tuned(71, 4, 128, device_kind="NVIDIA H200") is None      # T range
    assert tuned(65, 8, 128, device_kind="NVIDIA H200") is None      # G
    assert tuned(65, 4, 128, 4, device_kind="NVIDIA H200") is None   # float32
    assert tuned(65, 4, 128, device_kind="NVIDIA A100") is None      # kind
    # an entry with a cache-capacity range applies only inside it; the next entry may then match
    table["NVIDIA H200"].insert(0, {"t": [65, 65], "g": 4, "dh": 128, "s": [0, 4096],
                                    "config": {"num_stages": 4}})
    (tmp_path / "attn2.json").write_text(json.dumps(table))
    read = ta.attention_table(tmp_path / "attn2.json")
    assert tuned(65, 4, 128, device_kind="NVIDIA H200", s=4096).num_stages == 4
    assert tuned(65, 4, 128, device_kind="NVIDIA H200", s=8192).block_m == 32
    assert tuned(65, 4, 128, device_kind="NVIDIA H200").num_stages == 4  # s unknown
    # the shipped table (the default) parses, and its entries are KernelConfigs
    assert ta.attention_table() == json.loads(ta.TABLE_PATH.read_text())
    for kind, entries in json.loads(ta.TABLE_PATH.read_text()).items():
        for e in entries:
            assert isinstance(ta.tuned_attention_config(e["t"][0], e["g"], e["dh"], e.get("itemsize", 2),
                                                        device_kind=kind), KernelConfig)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"NVIDIA H200": [{"t": [1, 2], "g": 4, "dh": 128, "config": {"block_q": 8}}]}))
    with pytest.raises(ValueError, match="bad.json.*block_q.*needs t"):
        ta.attention_table(bad)
    bad = tmp_path / "bad2.json"
    bad.write_text(json.dumps({"NVIDIA H200": [{"t": [1, 2], "g": 4, "dh": 128, "s": [9, 1], "config": {}}]}))
    with pytest.raises(ValueError, match=r"s = \[9, 1\].*lo <= hi"):
        ta.attention_table(bad)
    with pytest.raises(ValueError, match="typo.json does not exist"):
        ta.attention_table(tmp_path / "typo.json")


def _verified_triton_modules(monkeypatch):
    """Collects verify() of every Triton module that pallas_call lowers for CUDA (jax internals:
    skips where they moved). The lowering needs no GPU; MLIR verification catches type errors
    that the Triton compiler would only report on the device."""
    try:
        from jax._src.pallas.triton import lowering as triton_lowering
        from jax._src.pallas.triton import pallas_call_registration as registration
    except ImportError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"no Pallas Triton lowering here: {e}")
    try:  # jax >= 0.11 asks the device for its compute capability
        from jax._src.pallas.triton import gpu_info
        monkeypatch.setattr(gpu_info, "get_gpu_info",
                            lambda: gpu_info._get_gpu_info_impl(gpu_info.GpuVersion.H200))
    except (ImportError, AttributeError):
        pass
    modules = []
    lower = triton_lowering.lower_jaxpr_to_triton_module

    def lower_and_keep(*a, **k):
        result = lower(*a, **k)
        modules.append(result.module)
        return result

    monkeypatch.setattr(registration.lowering, "lower_jaxpr_to_triton_module", lower_and_keep)
    return modules


@pytest.mark.parametrize("t,s,g,window,dh,dtype", [
    (1, 200, 4, False, 128, jnp.bfloat16), (1, 4096, 4, True, 128, jnp.bfloat16),
    (65, 4096, 4, False, 128, jnp.bfloat16), (257, 1024, 4, False, 128, jnp.bfloat16),
    (9, 0, 3, False, 128, jnp.bfloat16), (16, 700, 1, True, 128, jnp.bfloat16),
    # the shipped pair's verify at budget 256, its decode and DDTree-64 verify, float32 (TF32x3)
    (257, 1024, 2, False, 64, jnp.float32), (1, 512, 2, False, 64, jnp.float32),
    (65, 512, 2, False, 64, jnp.float32),
    # Qwen3.5-27B's full-attention layers (24 / 4 heads of 256): decode and DDTree-64's verify
    (1, 512, 6, False, 256, jnp.bfloat16), (65, 512, 6, False, 256, jnp.bfloat16)])
def test_triton_lowering_verifies(monkeypatch, t, s, g, window, dh, dtype):
    """The GPU path lowers (Triton dialect, CUDA) and every module verifies, on a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    hkv = 2
    sds = jax.ShapeDtypeStruct
    args = (sds((1, t, hkv * g, dh), dtype), sds((1, t, hkv, dh), dtype),
            sds((1, t, hkv, dh), dtype), sds((1, hkv, s, dh), dtype),
            sds((1, hkv, s, dh), dtype), sds((1,), jnp.int32), sds((1, t, t), jnp.bool_))
    fn = functools.partial(attention, scale=dh ** -0.5, impl="pallas")
    try:
        jax.jit(fn).trace(*args, kv_start=sds((1,), jnp.int32) if window else None).lower(
            lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    plan = launch_plan(1, t, hkv, g, dh, s, default_config(t, g, dh, jnp.dtype(dtype).itemsize))
    assert len(modules) == plan.kernels
    for module in modules:
        assert module.operation.verify()


def test_float32_products_take_tf32x3_on_the_compiled_path():
    """The Triton kernel's float32 products: three TF32 passes on the compiled path (IEEE float32
    runs on the FMA units: 4.5x slower rounds), HIGHEST in interpret mode; bf16 unaffected."""
    from ddtree_jax.kernels.tree_attention import _kernel_precision
    assert _kernel_precision(jnp.float32, False) == lax.DotAlgorithmPreset.TF32_TF32_F32_X3
    assert _kernel_precision(jnp.float32, True) == lax.Precision.HIGHEST
    assert _kernel_precision(jnp.bfloat16, False) == lax.Precision.DEFAULT


def test_impl_selection():
    """What "auto" means by device (kernel_tuning_for; the full table is test_dispatch.py's), the
    impls a user may pick there, and which impls take the kernels."""
    import types

    def auto(kind, platform="gpu", cc=None):
        dev = types.SimpleNamespace(device_kind=kind, platform=platform)
        if cc is not None:
            dev.compute_capability = cc
        return kernel_tuning_for(dev).auto_attention

    assert auto("cpu", platform="cpu") == "xla" and auto("TPU v5 lite", platform="tpu") == "xla"
    assert auto("NVIDIA H200", cc="9.0") in ("pallas", "xla")   # xla only where jax has no Triton lowering
    assert auto("Tesla V100-SXM2-16GB", cc="7.0") == "xla" and auto("AMD Instinct MI300X") == "xla"
    assert "pallas" not in dispatch.available_impls(CPU_KERNELS)
    assert "pallas_interpret" in dispatch.available_impls(CPU_KERNELS)
    assert dispatch.available_impls(GPU_KERNELS) == ("auto", "pallas", "triton", "xla", "pallas_interpret")
    assert not dispatch.takes_kernels(CPU_KERNELS, "attention") and dispatch.takes_kernels(GPU_KERNELS, "attention")
    assert not dispatch.takes_kernels(GPU_KERNELS.with_impls(attention="xla"), "attention")
    for impl in ("pallas_interpret", "pallas"):
        assert dispatch.takes_kernels(CPU_KERNELS.with_impls(attention=impl), "attention")
    with pytest.raises(ValueError, match="unknown attention impl"):
        attention(*[None] * 7, scale=1.0, impl="cuda")
    with pytest.raises(ValueError, match="chosen per device by ddtree_jax.kernels.dispatch"):
        attention(*[None] * 7, scale=1.0, impl="auto")


def test_reference_rejects_bad_shapes():
    _, j = make_inputs(1, t=4, s=8, hkv=2, g=2, dh=64, dtype=jnp.float32, cache_len=(8, 8))
    with pytest.raises(ValueError, match="multiple of kv heads"):
        attention_reference(j["q"][:, :, :3], j["k_new"], j["v_new"], j["k_cache"],
                            j["v_cache"], j["cache_len"], j["new_mask"], scale=1.0)


def test_auto_takes_xla_for_prompt_sized_t():
    """"auto" on a GPU runs the kernel for verify-sized T and the XLA path above the tuning's
    max_new_tokens (the kernel unrolls its new-key steps: minutes of compile at T=8192); the XLA
    path, which runs here, is the reference's."""
    kernels = dataclasses.replace(GPU_KERNELS, max_new_tokens=8)
    for t in (8, 9):
        rng = np.random.default_rng(t)
        q = jnp.asarray(rng.normal(size=(1, t, 4, 16)), jnp.float32)
        kv = jnp.asarray(rng.normal(size=(1, t, 2, 16)), jnp.float32)
        cache = jnp.zeros((1, 2, 4, 16), jnp.float32)
        mask = jnp.asarray(np.tril(np.ones((1, t, t), bool)))
        assert dispatch.attention_choice(kernels, q, cache) == ("pallas" if t == 8 else "xla", None)
    args = (q, kv, kv, cache, cache, jnp.zeros((1,), jnp.int32), mask)
    np.testing.assert_array_equal(np.asarray(dispatch.attention(kernels, *args, scale=0.25)),
                                  np.asarray(attention_reference(*args, scale=0.25)))


# ----------------------------------------------------------------------------- stacked caches

@pytest.mark.parametrize("t,s,g,cache_len,config", [
    (1, 300, 4, (300, 77), KernelConfig(block_m=16, block_k=32, num_splits=4)),   # decode, merged
    (16, 100, 2, (100, 3), None),                                                 # one part
])
def test_a_layer_of_stacked_caches(t, s, g, cache_len, config):
    """Caches of every layer stacked [L, Bt, Hkv, S, Dh] with a layer index (an int, or traced:
    one compiled kernel for every layer): the kernel reads that layer alone (the others hold
    NaN) and gives the one-layer call's output bit for bit."""
    _, j = make_inputs(7, t=t, s=s, hkv=2, g=g, dh=64, dtype=jnp.bfloat16, cache_len=cache_len)
    nan = jnp.full_like(j["k_cache"], jnp.nan)
    kc = jnp.stack([nan, nan, j["k_cache"], nan])
    vc = jnp.stack([nan, j["v_cache"], j["v_cache"], nan])
    pos = [j[k] for k in ("q", "k_new", "v_new")]
    rest = (j["cache_len"], j["new_mask"])
    for impl in ("pallas_interpret", "xla"):
        run = functools.partial(attention, scale=0.125, impl=impl, config=config)
        want = jax.jit(run)(*pos, j["k_cache"], j["v_cache"], *rest)
        got_int = jax.jit(functools.partial(run, layer=2))(*pos, kc, vc, *rest)
        got_traced = jax.jit(lambda layer, *a: run(*a, layer=layer))(jnp.int32(2), *pos, kc, vc, *rest)
        for got in (got_int, got_traced):
            assert not np.isnan(np.asarray(got, np.float32)).any()
            np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_stacked_cache_checks():
    _, j = make_inputs(1, t=4, s=8, hkv=2, g=2, dh=64, dtype=jnp.float32, cache_len=(8, 8))
    pos = [j[k] for k in ("q", "k_new", "v_new")]
    stacked = jnp.stack([j["k_cache"]] * 3)
    with pytest.raises(ValueError, match="layer 3 is out of range for a cache of 3 layers"):
        attention(*pos, stacked, stacked, j["cache_len"], j["new_mask"], scale=1.0, layer=3)
    with pytest.raises(ValueError, match=r"stacked \[L, Bt, Hkv, S, Dh\]"):
        attention(*pos, j["k_cache"], j["v_cache"], j["cache_len"], j["new_mask"], scale=1.0, layer=0)


@pytest.mark.parametrize("s,wide", [(4096, False), (32768, True)])
def test_triton_lowering_of_stacked_caches(monkeypatch, s, wide):
    """The Qwen3-8B decode over layer i of 36 stacked caches lowers for CUDA and verifies; past
    4 GiB (36 layers of 32k keys, batch 2) the lowering indexes the cache with 64-bit offsets,
    so the int32 offsets of a one-layer kernel never overflow."""
    modules = _verified_triton_modules(monkeypatch)
    sds = jax.ShapeDtypeStruct
    bt, hkv, g, dh, dtype = (2 if wide else 1), 8, 4, 128, jnp.bfloat16
    cache = sds((36, bt, hkv, s, dh), dtype)
    args = (sds((bt, 1, hkv * g, dh), dtype), sds((bt, 1, hkv, dh), dtype), sds((bt, 1, hkv, dh), dtype),
            cache, cache, sds((bt,), jnp.int32), sds((bt, 1, 1), jnp.bool_))
    fn = functools.partial(attention, scale=dh ** -0.5, impl="pallas")
    try:
        jax.jit(lambda layer, *a: fn(*a, layer=layer)).trace(sds((), jnp.int32), *args).lower(
            lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert modules and all(m.operation.verify() for m in modules)
    main = str(modules[0])
    assert ("tt.addptr" in main) and (("i64>" in main) == wide)
