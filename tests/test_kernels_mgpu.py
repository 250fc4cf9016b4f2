"""The Mosaic GPU tree-verify attention kernel (ddtree_jax/kernels/tree_attention_mgpu.py).

On the CPU the kernel body runs in Mosaic GPU's interpret mode (TMA copies, barriers and the
memory / compute warpgroups simulated; the two products as plain dots), against a float64
reference, with the cache's stale tail poisoned (and, over every layer's stacked caches, the
other layers); the real path is lowered for CUDA. The engine's padding of the verify rows (which
this kernel needs: T % 8 == 0) is tested in test_engine.py.
"""
from __future__ import annotations

import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax import tuning
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels import tree_attention as ta
from ddtree_jax.kernels import tree_attention_mgpu as mgpu
from ddtree_jax.kernels import split_merge
from ddtree_jax.kernels.split_merge import merge_splits_kernel
from ddtree_jax.kernels.tree_attention_mgpu import MgpuConfig, attention_mgpu
from test_kernels import make_inputs, numpy_reference, rel_err

pytestmark = pytest.mark.skipif(mgpu.plgpu is None, reason="this jax has no Mosaic GPU Pallas module")


def _stacked(cache, layers: int, layer: int):
    """`cache` as layer `layer` of `layers` stacked ones [L, Bt, Hkv, S, Dh], every other layer
    NaN: a kernel that read the wrong layer (or batch row of another layer) would return NaN."""
    return jnp.stack([cache if i == layer else jnp.full_like(cache, jnp.nan) for i in range(layers)])


def _run(seed, *, t, s, hkv, g, dh, cache_len, cfg, poison=np.nan, bt=None, stack=None):
    bt = len(cache_len) if bt is None else bt
    args, jargs = make_inputs(seed, bt=bt, t=t, s=s, hkv=hkv, g=g, dh=dh, dtype=jnp.bfloat16,
                              cache_len=cache_len, poison=poison)
    kw = dict(scale=dh**-0.5, config=cfg, interpret=True)
    if stack is None:
        out = attention_mgpu(**jargs, **kw)
    else:
        jargs = dict(jargs, k_cache=_stacked(jargs["k_cache"], 3, 1), v_cache=_stacked(jargs["v_cache"], 3, 1))
        if stack == "int":
            out = attention_mgpu(**jargs, **kw, layer=1)
        else:   # waited for before anything else runs (see mgpu.wait_if_interpreted)
            out = jax.block_until_ready(jax.jit(lambda layer, a: attention_mgpu(**a, **kw, layer=layer))(
                jnp.int32(1), jargs))
    assert out.shape == (bt, t, hkv * g, dh) and out.dtype == jnp.bfloat16
    got = np.asarray(out, np.float32)
    assert not np.isnan(got).any()
    return got, numpy_reference(**args, scale=dh**-0.5)


# stack: None, or every layer's caches stacked [3, Bt, Hkv, S, Dh] (the other layers NaN) with
# layer 1 given as a Python int ("int") or a traced int32 inside jit ("traced"): the kernel
# reads that layer's cache rows (layer * Bt + b) alone.
@pytest.mark.parametrize("t,s,hkv,g,dh,cache_len,cfg,poison,stack", [
    # one compute warpgroup, two stages: the ring wraps; a whole number of prefix blocks
    (24, 304, 2, 4, 64, (192,), MgpuConfig(compute_wgs=1, stages=2), np.nan, None),
    # G = 8 (8 tokens a block), Dh 128, a full cache (no stale tail)
    (40, 104, 1, 8, 128, (104,), MgpuConfig(), np.nan, None),
    # G = 1 (64 tokens a block), 128-key steps
    (64, 104, 2, 1, 64, (70,), MgpuConfig(block_k=128, stages=2, compute_wgs=1), np.nan, None),
    # 3 key steps over 4 CTAs (one has none), each CTA's share split between its warpgroups;
    # with skip_empty, CTA 2's one step is a new-key step
    (16, 104, 1, 4, 64, (70,), MgpuConfig(stages=4, split_keys=True, skip_empty=True, key_splits=4), np.nan, None),
    # overlap (the next QK issued before the softmax): split keys, 4 full prefix steps and a
    # ragged one (2 a warpgroup), a two-slot ring on two warpgroups, and two row blocks in one
    # CTA with the keys split over two CTAs (key_splits: partials merged by XLA): batch row 0's
    # two full prefix steps in CTA 0 (overlapped), its ragged step and new keys in CTA 1, row 1
    # with no prefix at all (every key a tree key; CTA 1 has no step); inf past cache_len
    (24, 304, 2, 4, 64, (300,), MgpuConfig(stages=4, split_keys=True, skip_empty=True, overlap=True), np.nan, None),
    (24, 304, 2, 4, 64, (192,), MgpuConfig(stages=2, skip_empty=True, overlap=True), np.nan, None),
    # (merge_kernel off: XLA's merge, the form where jax has no Pallas Triton for split_merge)
    (24, 200, 1, 4, 64, (137, 0), MgpuConfig(key_splits=2, overlap=True), np.inf, "int"),
    # tail_splits: 3 row blocks in 2 groups of 2; group 0 in the first launch, group 1 (block 2
    # and an empty block 3) in a second, its 4 prefix steps and new-key step split over 2 CTAs
    (40, 304, 1, 4, 64, (192,), MgpuConfig(stages=2, skip_empty=True, overlap=True, tail_splits=2), np.nan, None),
    # ... and one block a CTA (LONG_CACHE_CONFIGS[264]'s batch-1 form): blocks 0-1 in the first
    # launch, block 2 in a second, its 2 prefix steps and new-key step split over 3 CTAs
    (40, 104, 1, 4, 64, (70,), MgpuConfig(stages=4, split_keys=True, skip_empty=True, tail_splits=3), np.nan,
     "traced"),
    # ONE_WAVE_CONFIGS[72] (DDTree-64's default on the H200): one block a CTA, keys over 3 CTAs;
    # 5 key steps shared 2 / 2 / 1: the ragged 4th prefix step in CTA 1, the new keys alone in CTA 2
    (16, 304, 1, 4, 64, (250,), mgpu.ONE_WAVE_CONFIGS[72], np.nan, None),
    # ONE_WAVE_CONFIGS[16] (the drafter's block): keys over 8 CTAs; 3 key steps (2 prefix, 1 new),
    # so 5 of the 8 shares see no key and the merge must drop them
    (16, 104, 1, 4, 64, (70,), mgpu.ONE_WAVE_CONFIGS[16], np.nan, None),
    # the shares merged by the Pallas kernel (m), here the tail split's (block 2's keys over 2
    # CTAs; attention_mgpu runs cN's and tN's shares through the same merge call, and
    # test_merge_kernel_matches_the_xla_merge checks the kernel on key_splits' layouts)
    (40, 104, 1, 4, 64, (70,), MgpuConfig(stages=4, split_keys=True, tail_splits=2, merge_kernel=True), np.nan, None),
])
def test_matches_reference_in_interpret_mode(t, s, hkv, g, dh, cache_len, cfg, poison, stack):
    got, want = _run(3, t=t, s=s, hkv=hkv, g=g, dh=dh, cache_len=cache_len, cfg=cfg, poison=poison, stack=stack)
    assert rel_err(got, want) < 1e-2


@pytest.mark.parametrize("splits,bt,t,hkv,g,dh", [(3, 2, 24, 2, 4, 64), (8, 1, 72, 2, 4, 128), (2, 1, 16, 1, 8, 64),
                                                 (3, 1, 9, 5, 8, 128), (2, 2, 9, 3, 4, 128)])
def test_merge_kernel_matches_the_xla_merge(splits, bt, t, hkv, g, dh):
    """split_merge's one-kernel merge (interpret mode) equals merge_splits on the kernel's
    layout: shares at rows c * Bt + b, log2-sum-exp2 in folded row order, -1e30 where a share
    saw no key; T not a multiple of a row block's tokens; N not a power of two; 40 query heads
    in five blocks of 8, and 12 in two (the second block's last 4 masked)."""
    rng = np.random.default_rng(splits)
    tb = 64 // g
    parts = jnp.asarray(rng.standard_normal((splits * bt, t, hkv * g, dh)), jnp.bfloat16)
    lse = rng.standard_normal((splits * bt, hkv, -(-t // tb) * 64)).astype(np.float32) * 4
    lse[0, :, :7] = -1e30
    want = np.asarray(mgpu.merge_splits(parts, jnp.asarray(lse), splits=splits, g=g), np.float32)
    got = merge_splits_kernel(parts, jnp.asarray(lse), splits=splits, g=g, block_m=mgpu.BLOCK_M, interpret=True)
    assert got.shape == (bt, t, hkv * g, dh) and got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=8e-3, rtol=8e-3)


def test_merge_kernel_lowers_for_cuda():
    sds = jax.ShapeDtypeStruct
    fn = functools.partial(merge_splits_kernel, splits=3, g=4, block_m=mgpu.BLOCK_M)
    try:
        txt = jax.jit(fn).trace(sds((3, 72, 32, 128), jnp.bfloat16), sds((3, 8, 320), jnp.float32)).lower(
            lowering_platforms=("cuda",)).as_text()
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert "ddtree_split_merge" in txt


def test_fold_mask_layout():
    """Row gi*TB + tl of row block m holds token m*TB + tl's mask row, for every head gi; rows
    and keys past T are 0."""
    t, g, cfg = 24, 4, MgpuConfig(compute_wgs=2)
    rng = np.random.default_rng(0)
    mask = rng.random((2, t, t)) < 0.5
    folded = np.asarray(mgpu.fold_mask(jnp.asarray(mask), g, cfg, jnp.float32))
    tb = 64 // g
    assert folded.shape == (2, 64 * 2, 64)
    for m in range(2):
        for gi in range(g):
            for tl in range(tb):
                row, tok = m * 64 + gi * tb + tl, m * tb + tl
                want = mask[:, tok] if tok < t else np.zeros((2, t), bool)
                np.testing.assert_array_equal(folded[:, row, :t], want)
    assert not folded[:, :, t:].any()


def test_unsupported_inputs_are_named():
    q = jax.ShapeDtypeStruct((1, 24, 8, 64), jnp.bfloat16)
    kc = jax.ShapeDtypeStruct((1, 2, 104, 64), jnp.bfloat16)
    assert mgpu.mgpu_unsupported(q, kc) is None
    assert "multiple of 8" in mgpu.mgpu_unsupported(jax.ShapeDtypeStruct((1, 25, 8, 64), jnp.bfloat16), kc)
    assert "kv_start" in mgpu.mgpu_unsupported(q, kc, kv_start=jnp.zeros((1,), jnp.int32))
    assert "cache of 101 positions" in mgpu.mgpu_unsupported(q, jax.ShapeDtypeStruct((1, 2, 101, 64), jnp.bfloat16))
    assert "dtype" in mgpu.mgpu_unsupported(jax.ShapeDtypeStruct((1, 24, 8, 64), jnp.float32), kc)
    assert "query heads" in mgpu.mgpu_unsupported(
        jax.ShapeDtypeStruct((1, 24, 32, 64), jnp.bfloat16), jax.ShapeDtypeStruct((1, 2, 100, 64), jnp.bfloat16))
    assert "shared memory" in mgpu.mgpu_unsupported(q, kc, config=MgpuConfig(block_k=128, stages=4))
    assert "key_splits" in mgpu.mgpu_unsupported(q, kc, config=MgpuConfig(key_splits=0))
    assert "not both" in mgpu.mgpu_unsupported(q, kc, config=MgpuConfig(key_splits=2, tail_splits=4))
    with pytest.raises(ValueError, match="cannot take these inputs.*multiple of 8"):
        attention_mgpu(jnp.zeros((1, 25, 8, 64), jnp.bfloat16), jnp.zeros((1, 25, 2, 64), jnp.bfloat16),
                       jnp.zeros((1, 25, 2, 64), jnp.bfloat16), jnp.zeros((1, 2, 104, 64), jnp.bfloat16),
                       jnp.zeros((1, 2, 104, 64), jnp.bfloat16), jnp.zeros((1,), jnp.int32),
                       jnp.ones((1, 25, 25), bool), scale=0.125, interpret=True)
    stack, one = jnp.zeros((3, 1, 2, 104, 64), jnp.bfloat16), jnp.zeros((1, 2, 104, 64), jnp.bfloat16)
    rest = (jnp.zeros((1,), jnp.int32), jnp.ones((1, 24, 24), bool))
    new = (jnp.zeros((1, 24, 8, 64), jnp.bfloat16), jnp.zeros((1, 24, 2, 64), jnp.bfloat16),
           jnp.zeros((1, 24, 2, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match="layer 3 is out of range"):
        attention_mgpu(*new, stack, stack, *rest, scale=0.125, interpret=True, layer=3)
    with pytest.raises(ValueError, match="stacked"):
        attention_mgpu(*new, one, one, *rest, scale=0.125, interpret=True, layer=0)


@pytest.mark.parametrize("t,cfg", [(264, MgpuConfig()), (72, MgpuConfig(compute_wgs=1, stages=4)),
                                   (264, MgpuConfig(block_k=128, stages=2, compute_wgs=1)),
                                   (72, MgpuConfig(stages=4, split_keys=True, skip_empty=True, key_splits=2)),
                                   (264, mgpu.AUTO_CONFIGS[None]),   # the default: skip + overlap
                                   (256, mgpu.ONE_WAVE_CONFIGS[256]),   # one row block a CTA, one wave
                                   (264, MgpuConfig(stages=4, split_keys=True, skip_empty=True, overlap=True)),
                                   (72, MgpuConfig(overlap=True)),
                                   (264, mgpu.LONG_CACHE_CONFIGS[264][0]),   # long caches: the tail split
                                   (264, mgpu.LONG_CACHE_CONFIGS[264][1]),  # at batch 2
                                   (72, mgpu.ONE_WAVE_CONFIGS[72])])   # keys over 3 CTAs
def test_cuda_lowering(t, cfg):
    """The real path (wgmma, TMA, register layouts) lowers for CUDA at the 8B model's heads."""
    sds = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    shapes = (sds((1, t, 32, 128), bf), sds((1, t, 8, 128), bf), sds((1, t, 8, 128), bf),
              sds((1, 8, 1024, 128), bf), sds((1, 8, 1024, 128), bf), sds((1,), jnp.int32),
              sds((1, t, t), jnp.bool_))
    fn = functools.partial(attention_mgpu, scale=128**-0.5, config=cfg)
    try:
        txt = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert "mosaic_gpu" in txt


@pytest.mark.parametrize("t,cfg", [(264, mgpu.AUTO_CONFIGS[None]), (264, mgpu.LONG_CACHE_CONFIGS[264][0]),
                                   (72, mgpu.ONE_WAVE_CONFIGS[72])])
def test_cuda_lowering_of_a_stacked_cache(t, cfg):
    """The real path over every layer's caches [L, Bt, Hkv, S, Dh] with a traced layer lowers
    for CUDA (the default config, the tail split's two launches, the key split)."""
    sds = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    shapes = (sds((1, t, 32, 128), bf), sds((1, t, 8, 128), bf), sds((1, t, 8, 128), bf),
              sds((36, 1, 8, 1024, 128), bf), sds((36, 1, 8, 1024, 128), bf), sds((1,), jnp.int32),
              sds((1, t, t), jnp.bool_), sds((), jnp.int32))

    def fn(*a):
        return attention_mgpu(*a[:-1], scale=128**-0.5, config=cfg, layer=a[-1])
    try:
        txt = jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert "mosaic_gpu" in txt


def test_configs_by_t_and_config_specs():
    """config_for: a T without an entry takes AUTO_CONFIGS[None]; parse_config spells configs as
    the bench tools name them; a malformed spec is a one-line error."""
    assert mgpu.config_for(1000) == mgpu.AUTO_CONFIGS[None]
    assert mgpu.config_for(72, grid=(3, 8, 4), sms=132) == mgpu.AUTO_CONFIGS[72]   # no one-wave fit
    assert mgpu.config_for(72, grid=(2, 8, 4), sms=132, seq=8192, long_cache_from=5120) == mgpu.ONE_WAVE_CONFIGS[72]
    assert mgpu.config_for(72, grid=(2, 8, 4), sms=132, seq=8192) == mgpu.AUTO_CONFIGS[72]   # no long-cache rule
    pc = mgpu.parse_config
    assert pc("128x2w1") == MgpuConfig(block_k=128, stages=2, compute_wgs=1)
    assert pc(" 64x3w2 ") == MgpuConfig(64, 3, 2)
    assert pc("64x4w2kc2") == MgpuConfig(64, 4, 2, split_keys=True, key_splits=2)
    assert pc("64x3w2s") == MgpuConfig(64, 3, 2, skip_empty=True)
    assert pc("64x4w2kso") == MgpuConfig(64, 4, 2, split_keys=True, skip_empty=True, overlap=True)
    assert pc("64x4w2kc3m") == MgpuConfig(64, 4, 2, split_keys=True, key_splits=3, merge_kernel=True)
    assert pc("64x4w2kst16") == MgpuConfig(64, 4, 2, split_keys=True, skip_empty=True, tail_splits=16)
    assert pc("64x3w2so") == mgpu.AUTO_CONFIGS[None]
    for bad in ("fast", "64x3", "72:64x3w2"):
        with pytest.raises(ValueError, match="BKxSTAGESwWGS"):
            pc(bad)


def test_auto_dispatch_and_verify_rows(monkeypatch):
    """"auto" takes the kernel only where the device's KernelTuning has a Mosaic GPU range
    (compute capability 9.0), for T in that range and where a fitted config applies;
    dispatch.verify_rows pads T to 8 exactly then (and leaves it alone elsewhere, e.g. on this
    CPU)."""
    h200 = tuning.H200.kernels
    bf = jnp.bfloat16
    sds = jax.ShapeDtypeStruct

    def rows(t, hq=32, hkv=8, dh=128, dtype=bf, kernels=h200, **kw):
        return dispatch.verify_rows(kernels, t, hq, hkv, dh, dtype, **kw)

    def auto_cfg(bt, t, seq=1024, kernels=h200):
        return dispatch.mosaic_config(kernels, sds((bt, t, 32, 128), bf), sds((bt, 8, seq, 128), bf))

    # The default range: DDTree-248 to -255 (249-256 rows) pad to 256, which runs the one-wave
    # config while its grid fits the SMs (batch 1 on the 8B heads: 128 CTAs; batch 2: 256, so the
    # two-blocks-a-CTA default); 248 rows stay on Triton.
    assert rows(250) == 256 and rows(248) == 248
    assert auto_cfg(1, 256) == mgpu.ONE_WAVE_CONFIGS[256] and auto_cfg(1, 256).split_keys
    assert auto_cfg(2, 256) == auto_cfg(1, 264) == mgpu.AUTO_CONFIGS[None]
    # T = 264 over a long cache: at batch 1 the first 16 one-block groups (128 CTAs) in one wave,
    # the 17th split; at batch 2 the first 8 two-block groups (128 CTAs), the 9th split; not below
    # mosaic_long_cache_from, nor at batch 4 (256 CTAs before the tail), nor with the grid unknown.
    long_seq = h200.mosaic_long_cache_from
    one, two = mgpu.LONG_CACHE_CONFIGS[264]
    assert auto_cfg(1, 264, long_seq) == one and one.tail_splits > 1 and one.blocks_per_cta == 1
    assert auto_cfg(2, 264, 8192) == two and two.tail_splits > 1 and two.blocks_per_cta == 2
    assert auto_cfg(1, 264, long_seq - 128) == auto_cfg(4, 264, 8192) == mgpu.AUTO_CONFIGS[None]
    # T = 72, below the range: taken at batch 1 (5 blocks x 3 key shares x 8 kv heads = 120
    # CTAs, one wave) over any cache, padded from 65 rows; at batch 2 (240 CTAs, two waves) over
    # long caches only (LONG_CACHE_WAVES[72]); not at batch 3 (360 CTAs), nor on a GPU of fewer
    # SMs at batch 1, nor with 64 rows (no entry for T = 64).
    c72 = mgpu.ONE_WAVE_CONFIGS[72]
    assert auto_cfg(1, 72, long_seq) == auto_cfg(1, 72, 640) == c72 and c72.key_splits == 3
    # its shares merged by split_merge's kernel where jax has Pallas Triton
    assert c72.merge_kernel == (split_merge.pltriton is not None)
    assert mgpu.grid_ctas(72, 1, 8, 4, c72) == 120
    assert auto_cfg(2, 72, long_seq) == auto_cfg(2, 72, 8192) == c72 == mgpu.LONG_CACHE_CONFIGS[72][0]
    assert auto_cfg(2, 72, long_seq - 128) is None and auto_cfg(3, 72, 8192) is None
    assert auto_cfg(1, 64, 8192) is None
    # T = 16 (the drafter's block): 8 key shares, 64 CTAs a batch row; batches 1-2 fit one wave,
    # batch 3 (192) does not
    c16 = mgpu.ONE_WAVE_CONFIGS[16]
    assert c16.key_splits == 8 and c16.merge_kernel == (split_merge.pltriton is not None)
    assert mgpu.grid_ctas(16, 1, 8, 4, c16) == 64
    assert auto_cfg(1, 16, 640) == auto_cfg(2, 16, long_seq) == c16 and auto_cfg(3, 16, 640) is None
    assert rows(65, cache_size=long_seq) == rows(65, cache_size=640) == rows(65, cache_size=8192, batch=2) == 72
    assert rows(65, cache_size=3200, batch=2) == 65 and rows(64) == 64
    fewer = dataclasses.replace(h200, sm_count=114)   # 120 CTAs: two waves, the second of 6: Triton's at any cache
    assert auto_cfg(1, 72, 640, fewer) is None and auto_cfg(1, 72, 8192, fewer) is None
    assert mgpu.fills_waves(240, 132, 2) and mgpu.fills_waves(132, 132, 1) and mgpu.fills_waves(8, 132, 1)
    assert not mgpu.fills_waves(133, 132, 1) and not mgpu.fills_waves(120, 114, 2)
    assert not mgpu.fills_waves(360, 132, 2) and mgpu.fills_waves(171, 114, 2)
    assert mgpu.config_for(264, seq=8192, long_cache_from=long_seq) == mgpu.AUTO_CONFIGS[None]   # grid unknown
    assert auto_cfg(1, 256, 8192) == mgpu.ONE_WAVE_CONFIGS[256]
    assert mgpu.grid_ctas(256, 1, 8, 4, mgpu.ONE_WAVE_CONFIGS[256]) == 128
    assert mgpu.config_for(256) == mgpu.ONE_WAVE_CONFIGS[256]          # grid unknown: taken
    assert auto_cfg(1, 264, 8192) == one
    # by T alone inside the range (batch 4: no fitted config), not outside it
    assert h200.mosaic_t_range == (256, 1032)
    assert auto_cfg(4, 264) is not None and auto_cfg(4, 1032) is not None
    assert auto_cfg(4, 72) is None and auto_cfg(4, 40) is None and auto_cfg(4, 2000) is None
    blackwell = tuning.kernel_tuning_for(types.SimpleNamespace(platform="gpu", device_kind="NVIDIA B200",
                                                               compute_capability="10.0", core_count=148))
    assert blackwell.mosaic_t_range is None and auto_cfg(1, 264, kernels=blackwell) is None
    assert rows(257) == 264
    assert rows(257, dtype=jnp.float32) == 257       # fp32: Triton's
    assert rows(257, hkv=2) == 257                   # G = 16
    assert rows(1040) == 1040                        # above the range
    assert rows(257, kernels=tuning.CPU.kernels) == 257 and rows(257, kernels=h200.with_impls(attention="pallas")) == 257
    # "auto" runs the compiled kernel (not the interpreter) with the config it chose; T = 24 is
    # taken here by a range that holds it
    calls = []
    monkeypatch.setattr(mgpu, "attention_mgpu", lambda *a, **k: calls.append(k) or "mgpu")
    args = [jnp.zeros(s, bf) for s in ((1, 24, 8, 64), (1, 24, 2, 64), (1, 24, 2, 64), (1, 2, 56, 64), (1, 2, 56, 64))]
    wide = dataclasses.replace(h200, mosaic_t_range=(8, 1032))
    assert dispatch.attention_choice(wide, args[0], args[3]) == ("mosaic", mgpu.AUTO_CONFIGS[None])
    assert dispatch.attention(wide, *args, jnp.zeros((1,), jnp.int32), jnp.ones((1, 24, 24), bool), scale=0.1) == "mgpu"
    assert calls[0]["interpret"] is False and calls[0]["config"] == mgpu.AUTO_CONFIGS[None]
    assert dispatch.attention_choice(h200, args[0], args[3])[0] == "pallas"


def test_a_forward_lowers_one_kernel_for_all_its_layers():
    """attention_mgpu is jitted: n calls in one program lower to one callee (the kernel's Python
    lowering is ~0.4 s, and a 36-layer forward would otherwise hold 36 copies)."""
    sds = jax.ShapeDtypeStruct
    bf = jnp.bfloat16
    shapes = (sds((1, 24, 8, 64), bf), sds((1, 24, 2, 64), bf), sds((1, 24, 2, 64), bf),
              sds((1, 2, 128, 64), bf), sds((1, 2, 128, 64), bf), sds((1,), jnp.int32), sds((1, 24, 24), jnp.bool_))

    def text(n):
        def chain(q, *rest):
            for _ in range(n):
                q = ta.attention(q, *rest, scale=0.125, impl="mosaic")
            return q
        try:
            return jax.jit(chain).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()
        except RuntimeError as e:  # pragma: no cover - depends on the installed jax
            pytest.skip(f"cannot lower for CUDA here: {e}")

    one, three = text(1), text(3)
    assert one.count("mosaic_gpu") == three.count("mosaic_gpu") > 0
    assert len(three) < 1.2 * len(one)


def test_skipping_empty_new_key_steps_is_exact():
    """skip_empty: a new-key step whose mask tile is all 0 for a row block only passes its slot
    on. With 8 tokens a block (G = 8) and two 64-key steps, the first blocks of a tree see no key
    of the second step, so steps are skipped (the flags say so), and the output is the
    reference's (a wrongly skipped step would drop keys some row sees). Bit-for-bit equality with
    the unskipped kernel follows from fold() being the same code; the interpreter is too slow to
    run both here."""
    t, s, hkv, g, dh = 72, 40, 1, 8, 64
    args, jargs = make_inputs(11, bt=1, t=t, s=s, hkv=hkv, g=g, dh=dh, dtype=jnp.bfloat16, cache_len=(33,))
    skip = MgpuConfig(stages=2, compute_wgs=2, skip_empty=True)
    flags = np.asarray(mgpu.step_flags(mgpu.fold_mask(jargs["new_mask"], g, skip), skip))
    assert flags.shape == (1, 10, 2) and (flags == 0).any() and flags[:, :9, 0].all()
    out = np.asarray(attention_mgpu(**jargs, scale=0.125, config=skip, interpret=True), np.float32)
    assert not np.isnan(out).any()
    assert rel_err(out, numpy_reference(**args, scale=0.125)) < 1e-2

