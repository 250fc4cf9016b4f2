"""ddtree_jax.kernels.norms: Pallas kernels (interpret mode) vs the XLA path, and the model wiring.

CPU only. The XLA path is pinned bit-exactly to the model's own math (layers.rms_norm, the
unfused q/k norm + RoPE); the kernels are compared with it at float32 (~1e-6) and bfloat16 (two
ulps of the largest element). bfloat16 differs because XLA elides the bfloat16 roundings inside a
fusion (of x + delta before the norm, of the normed row before the weight multiply, of the q/k
norm before RoPE: excess precision, on by default); the kernels round where the model's code
says to. With XLA_FLAGS=--xla_allow_excess_precision=false the bfloat16 results agree exactly
on these inputs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.models import target as tmodel
from ddtree_jax.models.config import DrafterConfig, RopeConfig, TargetConfig
from ddtree_jax.models.init import init_drafter, init_target
from ddtree_jax.models.layers import KVCache, apply_rope, layer_view, rms_norm as layers_rms_norm, rope_tables
from ddtree_jax.kernels import dispatch, norms
from ddtree_jax.kernels.stacking import StackedRow
from ddtree_jax.tuning import CPU_KERNELS, GPU_KERNELS

EPS = 1e-6


def assert_close(out, ref, dtype, what=""):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, what
    tol = 2e-6 if dtype == jnp.float32 else 2.0**-6  # bf16: two ulps of the largest element
    err, scale = np.max(np.abs(out - ref)), np.max(np.abs(ref))
    assert err <= tol * scale, f"{what}: max abs diff {err:.3g} vs max |ref| {scale:.3g}"


def rand(rng, shape, dtype, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32).astype(dtype)


def count_pallas_calls(fn, *args) -> list[str]:
    """Names of the pallas_calls in fn's jaxpr, nested jaxprs included."""
    names = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "pallas_call":
                info = eqn.params.get("name_and_src_info") or eqn.params.get("name")
                names.append(getattr(info, "name", str(info)))
            for sub in jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return names


# ----------------------------------------------------------------------------- norms

NORM_CASES = [(n, 96) for n in (1, 3, 16, 65, 257)] + [(3, 32), (257, 32), (1, 4096), (65, 4096)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rows,hidden", NORM_CASES)
def test_norms_match_xla(rows, hidden, dtype):
    rng = np.random.default_rng(rows * 7 + hidden)
    x = rand(rng, (rows, hidden), dtype, 3.0)
    d = rand(rng, (rows, hidden), dtype)
    w = rand(rng, (hidden,), jnp.float32)

    @jax.jit  # one compile for both paths
    def run(x, d, w):
        return [(norms.add_rms_norm(x, d, w, EPS, impl=i), norms.rms_norm(x, w, EPS, impl=i))
                for i in ("pallas_interpret", "xla")]

    ((s, y), y1), ((_, y_ref), y1_ref) = run(x, d, w)
    np.testing.assert_array_equal(np.asarray(s, np.float32), np.asarray(x + d, np.float32))
    assert s.dtype == y.dtype == y1.dtype == dtype
    assert_close(y, y_ref, dtype, "add_rms_norm")
    assert_close(y1, y1_ref, dtype, "rms_norm")


def test_norm_leading_dims_and_xla_path_is_the_models_math():
    rng = np.random.default_rng(0)
    x, d = rand(rng, (2, 5, 48), jnp.bfloat16), rand(rng, (2, 5, 48), jnp.bfloat16)
    w = rand(rng, (48,), jnp.bfloat16)
    np.testing.assert_array_equal(norms.rms_norm(x, w, EPS, impl="xla"), layers_rms_norm(x, w, EPS))
    s, y = norms.add_rms_norm(x, d, w, EPS, impl="pallas_interpret")
    assert s.shape == y.shape == x.shape
    assert_close(y, layers_rms_norm(x + d, w, EPS), jnp.bfloat16)
    for bad in (d[:, :-1], d[None]):
        with pytest.raises(ValueError, match="must have the same shape"):
            norms.add_rms_norm(x, bad, w, EPS, impl="xla")


# ----------------------------------------------------------------------------- q/k norm + RoPE

QK_CASES = [  # (Hq, Hkv, Dh, tokens, q/k norm, dtype)
    (4, 2, 16, 65, True, jnp.float32), (4, 2, 16, 65, False, jnp.bfloat16), (4, 2, 16, 1, True, jnp.bfloat16),
    (32, 8, 128, 1, True, jnp.bfloat16), (32, 8, 128, 16, True, jnp.float32),  # the Qwen3-8B shape
    (32, 8, 128, 1, False, jnp.float32),                                       # Llama-3-8B
    (12, 3, 32, 17, True, jnp.bfloat16), (12, 3, 32, 17, False, jnp.float32),  # heads not powers of two
    (0, 2, 16, 5, True, jnp.float32), (6, 0, 16, 5, True, jnp.bfloat16),      # drafter: k|v only, q only
]


def qk_inputs(seed, hq, hkv, dh, t, dtype, bt=1):
    rng = np.random.default_rng(seed)
    qkv = rand(rng, (bt, t, (hq + 2 * hkv) * dh), dtype, 2.0)
    pos = jnp.asarray(rng.integers(0, 4096, (bt, t)), jnp.int32)
    cos, sin = rope_tables(pos, RopeConfig(theta=1e6), dh)
    return qkv, cos, sin, rand(rng, (dh,), dtype), rand(rng, (dh,), dtype)


@pytest.mark.parametrize("hq,hkv,dh,t,qk_norm,dtype", QK_CASES,
                         ids=lambda v: getattr(v, "__name__", str(v)))
def test_qk_norm_rope_matches_xla(hq, hkv, dh, t, qk_norm, dtype):
    qkv, cos, sin, qw, kw = qk_inputs(hq + t, hq, hkv, dh, t, dtype)
    qw, kw = (qw, kw) if qk_norm else (None, None)

    @jax.jit  # one compile for both paths
    def run(qkv, cos, sin, qw, kw):
        return [norms.qk_norm_rope(qkv, qw, kw, cos, sin, num_heads=hq, num_kv_heads=hkv, head_dim=dh,
                                   eps=EPS, impl=i) for i in ("pallas_interpret", "xla")]

    out, ref = run(qkv, cos, sin, qw, kw)
    for name, o, r, heads in zip("qkv", out, ref, (hq, hkv, hkv)):
        if not heads:
            assert o is None and r is None
            continue
        assert o.shape == (1, t, heads, dh) and o.dtype == dtype, name
        if name == "v":
            np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(r, np.float32))
        else:
            assert_close(o, r, dtype, name)


def test_qk_xla_path_is_the_models_math():
    hq, hkv, dh = 4, 2, 16
    qkv, cos, sin, qw, kw = qk_inputs(1, hq, hkv, dh, 7, jnp.bfloat16, bt=2)

    @jax.jit
    def both(qkv, cos, sin, qw, kw):
        ours = norms.qk_norm_rope(qkv, qw, kw, cos, sin, num_heads=hq, num_kv_heads=hkv, head_dim=dh,
                                  eps=EPS, impl="xla")
        heads = qkv.reshape(2, 7, hq + 2 * hkv, dh)
        model = (apply_rope(layers_rms_norm(heads[:, :, :hq], qw, EPS), cos, sin),
                 apply_rope(layers_rms_norm(heads[:, :, hq:hq + hkv], kw, EPS), cos, sin), heads[:, :, hq + hkv:])
        return ours, model

    for a, b in zip(*both(qkv, cos, sin, qw, kw)):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- stacked weights

def nan_stack(w, layer=1, n=3):
    """[n, *w.shape]: w at row layer, NaN elsewhere (a kernel that reads another row shows it)."""
    return jnp.full((n, *w.shape), jnp.nan, w.dtype).at[layer].set(w)


def assert_same(outs, refs, what):
    outs, refs = jax.tree_util.tree_leaves(outs), jax.tree_util.tree_leaves(refs)
    assert len(outs) == len(refs), what
    for o, r in zip(outs, refs):
        assert o.dtype == r.dtype, what
        np.testing.assert_array_equal(np.asarray(o, np.float32), np.asarray(r, np.float32), err_msg=what)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_norms_read_one_layer_of_stacked_weights(dtype):
    """layer given: w is every layer's weight stacked [L, H] and the kernel reads row layer, a
    Python int or a traced int32 (one compiled kernel for every layer), or w is a StackedRow (the
    models' form). The other rows are NaN: the kernels' results are the one-layer call's bit for
    bit, the XLA path's within the tolerances above. A traced layer past the end reads the last
    row, as XLA's dynamic index does."""
    rng = np.random.default_rng(5)
    x = rand(rng, (5, 96), dtype, 3.0)   # H = 96: the kernel's rows and weight padded to 128
    d = rand(rng, (5, 96), dtype)
    w = rand(rng, (96,), jnp.float32)

    def calls(w, layer, impl):
        kw = dict(impl=impl, layer=layer)
        return norms.rms_norm(x, w, EPS, **kw), norms.add_rms_norm(x, d, w, EPS, **kw)

    @jax.jit
    def run(ws, w1, layer):
        return {"traced": calls(ws, layer, "pallas_interpret"), "int": calls(ws, 1, "pallas_interpret"),
                "row": calls(StackedRow(ws, layer), None, "pallas_interpret"),
                "one": calls(w1, None, "pallas_interpret"), "xla": calls(ws, layer, "xla"),
                "xla_int": calls(ws, 1, "xla")}

    out = run(nan_stack(w), w, jnp.int32(1))
    assert_same(out["traced"], out["one"], "traced layer")
    assert_same(out["int"], out["one"], "static layer")
    assert_same(out["row"], out["one"], "StackedRow")
    for ref in (out["xla"], out["xla_int"]):
        for o, r in zip(jax.tree_util.tree_leaves(out["traced"]), jax.tree_util.tree_leaves(ref)):
            assert_close(o, r, dtype, "stacked vs xla")
    ws = jnp.stack([w, 2 * w, -w])
    out = run(ws, ws[2], jnp.int32(5))   # same shapes: no recompile
    assert_same(out["traced"], out["one"], "clamped layer")
    for o, r in zip(jax.tree_util.tree_leaves(out["traced"]), jax.tree_util.tree_leaves(out["xla"])):
        assert_close(o, r, dtype, "clamped layer vs xla")


@pytest.mark.parametrize("norms_of", ["qk", "q", "none"])
def test_qk_norm_rope_reads_one_layer_of_stacked_weights(norms_of):
    """As above for qk_norm_rope's q/k norm weights [L, Dh] (either may be None: a Llama layer
    takes no layer input at all), given a layer or as StackedRows."""
    hq, hkv, dh = 4, 2, 16
    qkv, cos, sin, qw, kw = qk_inputs(9, hq, hkv, dh, 5, jnp.bfloat16)
    ws = (qw if "q" in norms_of else None, kw if "k" in norms_of else None)
    stacks = tuple(None if w is None else nan_stack(w) for w in ws)

    def call(qw, kw, layer, impl):
        return norms.qk_norm_rope(qkv, qw, kw, cos, sin, num_heads=hq, num_kv_heads=hkv, head_dim=dh,
                                  eps=EPS, impl=impl, layer=layer)

    @jax.jit
    def run(stacks, ws, layer):
        rows = (None if w is None else StackedRow(w, layer) for w in stacks)
        return {"traced": call(*stacks, layer, "pallas_interpret"), "int": call(*stacks, 1, "pallas_interpret"),
                "row": call(*rows, None, "pallas_interpret"),
                "one": call(*ws, None, "pallas_interpret"), "xla": call(*stacks, layer, "xla")}

    out = run(stacks, ws, jnp.int32(1))
    assert_same(out["traced"], out["one"], "traced layer")
    assert_same(out["int"], out["one"], "static layer")
    assert_same(out["row"], out["one"], "StackedRow")
    for o, r in zip(out["traced"], out["xla"]):
        assert_close(o, r, jnp.bfloat16, "stacked vs xla")


def test_stacked_weights_bad_inputs():
    x, w = jnp.ones((2, 8)), jnp.ones((3, 8))
    for impl in ("xla", "pallas_interpret"):
        for bad in (jnp.ones(8), jnp.ones((3, 6)), jnp.ones((3, 8, 1))):
            with pytest.raises(ValueError, match=r"stacked \[L, 8\]"):
                norms.rms_norm(x, bad, EPS, impl=impl, layer=0)
            with pytest.raises(ValueError, match=r"stacked \[L, 8\]"):
                norms.add_rms_norm(x, x, bad, EPS, impl=impl, layer=0)
        for layer in (3, -1, np.int32(5)):
            with pytest.raises(ValueError, match=f"layer {layer} is out of range for 3 stacked norm weights"):
                norms.rms_norm(x, w, EPS, impl=impl, layer=layer)
            with pytest.raises(ValueError, match="out of range"):
                norms.add_rms_norm(x, x, w, EPS, impl=impl, layer=layer)
        qkv, cos, sin, qw, kw = qk_inputs(0, 2, 1, 16, 3, jnp.float32)
        kw_args = dict(num_heads=2, num_kv_heads=1, head_dim=16, eps=EPS, impl=impl)
        with pytest.raises(ValueError, match="the q norm weight must be"):
            norms.qk_norm_rope(qkv, qw, None, cos, sin, layer=0, **kw_args)
        with pytest.raises(ValueError, match="layer 4 is out of range for 2 stacked k norm weights"):
            norms.qk_norm_rope(qkv, None, jnp.stack([kw, kw]), cos, sin, layer=4, **kw_args)
        two = jnp.stack([kw, kw])
        with pytest.raises(ValueError, match="layers differ"):
            norms.qk_norm_rope(qkv, StackedRow(two, 0), StackedRow(two, 1), cos, sin, **kw_args)
        with pytest.raises(ValueError, match="carries its own layer"):
            norms.rms_norm(x, StackedRow(w, 0), EPS, impl=impl, layer=0)
        with pytest.raises(ValueError, match="Python int or an integer scalar"):
            norms.rms_norm(x, w, EPS, impl=impl, layer=jnp.float32(1))


# ----------------------------------------------------------------------------- dispatch, lowering

def test_impl_selection_and_fallbacks():
    """The norms' impl goes with the attention's unless given ("triton" is "pallas"); "auto" is
    the device's choice, and XLA's path for shapes the kernels cannot take; an explicit Pallas
    impl on those raises."""
    assert [CPU_KERNELS.with_impls(attention=i).norm_impl for i in ("auto", "xla", "pallas", "triton",
                                                                   "pallas_interpret")] == [
        "auto", "xla", "pallas", "pallas", "pallas_interpret"]
    assert CPU_KERNELS.with_impls(attention="xla", norms="pallas_interpret").norm_impl == "pallas_interpret"
    with pytest.raises(ValueError, match="unknown norm impl"):
        CPU_KERNELS.with_impls(norms="cuda")
    x = jnp.ones((3, 8))
    with pytest.raises(ValueError, match="unknown norm impl"):
        norms.rms_norm(x, jnp.ones(8), EPS, impl="cuda")
    with pytest.raises(ValueError, match="chosen per device"):
        norms.rms_norm(x, jnp.ones(8), EPS, impl="auto")
    # auto is the XLA path off NVIDIA GPUs, the kernel on them
    assert count_pallas_calls(lambda a: dispatch.add_rms_norm(CPU_KERNELS, a, a, jnp.ones(8), EPS), x) == []
    assert count_pallas_calls(lambda a: dispatch.add_rms_norm(GPU_KERNELS, a, a, jnp.ones(8), EPS), x) == [
        "ddtree_add_rms_norm"]
    qkv, cos, sin, qw, kw = qk_inputs(0, 2, 1, 12, 3, jnp.float32)  # head dim 12: not a power of two
    args = (qkv, qw, kw, cos, sin)
    kw_args = dict(num_heads=2, num_kv_heads=1, head_dim=12, eps=EPS)
    assert dispatch.norm_choice(GPU_KERNELS, norms.qk_unsupported(qkv, 12)) == "xla"
    assert count_pallas_calls(lambda *a: dispatch.qk_norm_rope(GPU_KERNELS, *a, **kw_args), *args) == []
    with pytest.raises(ValueError, match="power of two"):
        norms.qk_norm_rope(*args, impl="pallas_interpret", **kw_args)
    with pytest.raises(ValueError, match="qkv must be"):
        norms.qk_norm_rope(*args, num_heads=3, num_kv_heads=1, head_dim=12, eps=EPS)
    np.testing.assert_array_equal(norms.qk_norm_rope(*args, **kw_args)[0],
                                  norms.qk_norm_rope(*args, impl="xla", **kw_args)[0])


@pytest.mark.skipif(norms.pltriton is None, reason="this jax has no Pallas Triton lowering")
def test_triton_lowering_one_kernel_each():
    """Lowering for CUDA needs no GPU: it checks the Pallas -> Triton IR rules (power-of-two
    tensors, supported primitives) for the Qwen3-8B shapes, and that each call is one kernel."""
    sds, bf, f32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.float32

    def triton_calls(fn, *avals):
        txt = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
        return txt.count("__gpu$xla.gpu.triton")

    for t, h in [(1, 4096), (65, 4096), (3, 5120), (7, 96)]:
        x = sds((1, t, h), bf)
        assert triton_calls(lambda a, b, w: norms.add_rms_norm(a, b, w, EPS, impl="pallas"), x, x, sds((h,), bf)) == 1
        assert triton_calls(lambda a, w: norms.rms_norm(a, w, EPS, impl="pallas"), x, sds((h,), bf)) == 1
    for hq, hkv, dh, t in [(32, 8, 128, 1), (32, 8, 128, 257), (40, 8, 128, 3), (0, 8, 128, 16), (4, 2, 16, 65)]:
        tab = sds((1, t, dh), f32)
        w = sds((dh,), bf)
        for qk in (True, False):
            def fn(qkv, c, s, qw, kw, qk=qk, hq=hq, hkv=hkv, dh=dh):
                return norms.qk_norm_rope(qkv, qw if qk else None, kw if qk else None, c, s, num_heads=hq,
                                          num_kv_heads=hkv, head_dim=dh, eps=EPS, impl="pallas")
            assert triton_calls(fn, sds((1, t, (hq + 2 * hkv) * dh), bf), tab, tab, w, w) == 1


@pytest.mark.skipif(norms.pltriton is None, reason="this jax has no Pallas Triton lowering")
def test_triton_lowering_stacked_weights_traced_layer(monkeypatch):
    """The stacked form with a traced layer lowers for CUDA (Qwen3-8B shapes, 36 layers): one
    kernel a call, whose Triton module verifies, taking the stack whole (no slice before it)."""
    from test_kernels import _verified_triton_modules
    modules = _verified_triton_modules(monkeypatch)
    sds, bf, f32 = jax.ShapeDtypeStruct, jnp.bfloat16, jnp.float32
    layer = sds((), jnp.int32)

    def check(fn, *avals):
        before = len(modules)
        txt = jax.jit(fn).trace(*avals, layer).lower(lowering_platforms=("cuda",)).as_text()
        assert txt.count("__gpu$xla.gpu.triton") == 1 and "dynamic_slice" not in txt
        assert len(modules) == before + 1 and modules[-1].operation.verify()

    for t, h in [(1, 4096), (3, 5120)]:   # 5120: the stack's rows padded to 8192 and masked
        x, w = sds((1, t, h), bf), sds((36, h), bf)
        check(lambda a, w, i: norms.rms_norm(a, w, EPS, impl="pallas", layer=i), x, w)
        check(lambda a, b, w, i: norms.add_rms_norm(a, b, w, EPS, impl="pallas", layer=i), x, x, w)
    w = sds((36, 128), bf)
    for hq, hkv, t in [(32, 8, 1), (32, 8, 17), (0, 8, 16)]:
        tab = sds((1, t, 128), f32)
        check(lambda qkv, c, s, qw, kw, i, hq=hq, hkv=hkv: norms.qk_norm_rope(
            qkv, qw, kw, c, s, num_heads=hq, num_kv_heads=hkv, head_dim=128, eps=EPS, impl="pallas", layer=i),
            sds((1, t, (hq + 2 * hkv) * 128), bf), tab, tab, w, w)


# ----------------------------------------------------------------------------- the models

def tiny_models(qk_norm=True, fused=True):
    # head_dim 16: the smallest the Pallas attention kernel takes, so the whole forward is Pallas.
    tc = TargetConfig(family="qwen3" if qk_norm else "llama", vocab_size=48, hidden_size=48,
                      intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      rms_eps=EPS, max_position=4096, tie_embeddings=False, qk_norm=qk_norm, qkv_bias=False)
    dc = DrafterConfig(hidden_size=48, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, rms_eps=EPS, block_size=4, target_layer_ids=(0, 1), mask_token_id=47,
                       num_target_layers=2, vocab_size=48, sliding_windows=(None, None))

    def noisy_norms(tree, key):  # init's norm weights are ones: make the weight multiply count
        leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
        keys = jax.random.split(key, len(leaves))
        return jax.tree_util.tree_unflatten(treedef, [
            a + 0.2 * jax.random.normal(k, a.shape) if "norm" in jax.tree_util.keystr(p) else a
            for (p, a), k in zip(leaves, keys)])

    tp = tmodel.fuse_params(noisy_norms(init_target(tc, jax.random.PRNGKey(0)), jax.random.PRNGKey(1)))
    dp = noisy_norms(init_drafter(dc, jax.random.PRNGKey(2)), jax.random.PRNGKey(3))
    return tc, tp, dc, (dmodel.fuse_params(dp) if fused else dp)


def forward_inputs(tc, seed: int, cache_len: list[int], t: int = 5, s: int = 24):
    """A target.forward call's (tokens, positions, 2-layer float32 cache of s slots, cache_len,
    causal mask) for len(cache_len) rows of t new tokens after the given prefixes."""
    bt = len(cache_len)
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, tc.vocab_size, (bt, t)), jnp.int32)
    cache_len = jnp.array(cache_len, jnp.int32)
    pos = cache_len[:, None] + jnp.arange(t, dtype=jnp.int32)
    cache = KVCache.from_layers([rand(rng, (bt, 2, s, 16), jnp.float32) for _ in range(2)],
                                [rand(rng, (bt, 2, s, 16), jnp.float32) for _ in range(2)])
    return tokens, pos, cache, cache_len, tmodel.causal_mask(bt, t)


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qwen3", "llama"])
def test_target_forward_pallas_interpret_matches_xla(qk_norm):
    tc, tp, _, _ = tiny_models(qk_norm)
    tokens, pos, cache, cache_len, mask = forward_inputs(tc, 0, [9, 17])

    # Qwen3: the whole forward in interpret mode; Llama: only the norm kernels (keeps it fast).
    norms_only = CPU_KERNELS.with_impls(attention="xla", norms="pallas_interpret")
    kernels = CPU_KERNELS.with_impls(attention="pallas_interpret") if qk_norm else norms_only

    def run(kernels):
        return tmodel.forward(tp, tc, tokens, pos, cache, cache_len, mask, taps=(0, 1), kernels=kernels)

    xla = CPU_KERNELS.with_impls(attention="xla")
    (h, taps, (ks, vs)), (h_ref, taps_ref, (ks_ref, vs_ref)) = jax.jit(lambda: (run(kernels), run(xla)))()
    assert_close(h, h_ref, jnp.float32, "final hidden")
    assert_close(taps, taps_ref, jnp.float32, "taps")
    for a, b in zip(ks + vs, ks_ref + vs_ref):
        assert_close(a, b, jnp.float32, "new k/v")
    # The layer loop's calls: one first norm, then per layer qk_norm_rope and two add_rms_norms.
    names = count_pallas_calls(
        lambda: tmodel.forward(tp, tc, tokens, pos, cache, cache_len, mask, kernels=norms_only))
    assert sorted(names) == sorted(["ddtree_rms_norm"] + ["ddtree_qk_norm_rope", "ddtree_add_rms_norm",
                                                          "ddtree_add_rms_norm"] * tc.num_layers)


def test_drafter_pallas_interpret_matches_xla():
    _, _, dc, dp = tiny_models()
    rng = np.random.default_rng(1)
    cache = KVCache.zeros(dc.num_layers, 1, dc.num_kv_heads, 16, dc.head_dim, jnp.float32)
    taps = rand(rng, (1, 6, 2 * dc.hidden_size), jnp.float32)
    ctx_pos = jnp.arange(6, dtype=jnp.int32)[None]
    block = rand(rng, (1, dc.block_size, dc.hidden_size), jnp.float32)
    blk_pos = 6 + jnp.arange(dc.block_size, dtype=jnp.int32)[None]
    length = jnp.array([6], jnp.int32)

    def run(impl):
        kernels = CPU_KERNELS.with_impls(attention="xla", norms=impl)
        c = dmodel.extend_cache(dp, dc, cache, jnp.zeros(1, jnp.int32), taps, ctx_pos, kernels=kernels)
        return c, dmodel.draft_hidden(dp, dc, block, blk_pos, c, length, kernels=kernels)

    (c, h), (c_ref, h_ref) = jax.jit(lambda: (run("pallas_interpret"), run("xla")))()
    for a, b in ((c.k, c_ref.k), (c.v, c_ref.v)):
        assert_close(a, b, jnp.float32, "drafter context k/v")
    assert_close(h, h_ref, jnp.float32, "drafter hidden")


@pytest.mark.parametrize("cache_impl", ["xla", "pallas_interpret"])
def test_drafter_fused_layout_matches_per_layer(cache_impl):
    """fuse_params' layout (per layer one q/k/v product; every layer's context k/v in one product,
    one norm fusion and one cache write) computes what the per-layer weights do, and the noise
    block takes one qk_norm_rope kernel a layer (not one for q and one for k/v)."""
    _, _, dc, raw = tiny_models(fused=False)
    fused = dmodel.fuse_params(raw)
    assert "ctx_kv" in fused and fused["ctx_kv"].shape == (dc.hidden_size, dc.num_layers * 2 * dc.num_kv_heads * dc.head_dim)
    assert all("qkv" in p and not {"q", "k", "v"} & set(p) for p in fused["layers"])
    rng = np.random.default_rng(3)
    cache = KVCache.from_layers(
        [rand(rng, (2, dc.num_kv_heads, 20, dc.head_dim), jnp.float32) for _ in range(dc.num_layers)],
        [rand(rng, (2, dc.num_kv_heads, 20, dc.head_dim), jnp.float32) for _ in range(dc.num_layers)])
    taps = rand(rng, (2, 5, 2 * dc.hidden_size), jnp.float32)
    start = jnp.array([3, 9], jnp.int32)
    ctx_pos = start[:, None] + jnp.arange(5, dtype=jnp.int32)
    block = rand(rng, (2, dc.block_size, dc.hidden_size), jnp.float32)
    blk_pos = start[:, None] + 5 + jnp.arange(dc.block_size, dtype=jnp.int32)

    def run(dp, impl):
        kernels = CPU_KERNELS.with_impls(attention="xla", norms=impl, cache=cache_impl)
        c = dmodel.extend_cache(dp, dc, cache, start, taps, ctx_pos, kernels=kernels)
        return c, dmodel.draft_hidden(dp, dc, block, blk_pos, c, start + 5, kernels=kernels)

    (c, h), (c_ref, h_ref) = jax.jit(lambda: (run(fused, "xla"), run(raw, "xla")))()
    for a, b in ((c.k, c_ref.k), (c.v, c_ref.v)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(h, h_ref, rtol=1e-4, atol=1e-4)
    # the untouched cache rows stay as they were
    np.testing.assert_array_equal(c.k[0][0, :, :3], cache.k[0][0, :, :3])
    names = count_pallas_calls(lambda: run(fused, "pallas_interpret"))
    assert names.count("ddtree_qk_norm_rope") == dc.num_layers
    assert names.count("kv_cache_write") == (1 if cache_impl != "xla" else 0)


def test_training_paths_stay_on_xla():
    """forward_train and the drafter's training blocks are differentiated: no Pallas kernel there
    (XLA_KERNELS, whatever the device), while the inference forward under a GPU's "auto" takes
    the norm kernels."""
    tc, tp, dc, dp = tiny_models()
    tokens = jnp.zeros((1, 4), jnp.int32)
    assert count_pallas_calls(lambda: tmodel.forward_train(tp, tc, tokens)) == []
    x = jnp.zeros((1, 4, dc.hidden_size))
    cos, sin = rope_tables(jnp.zeros((1, 4), jnp.int32), dc.rope, dc.head_dim)
    p = layer_view(dp, 0)   # its norm weights: StackedRows of the stacks
    assert count_pallas_calls(lambda: dmodel.block_qkv(p, dc, x, cos, sin)) == []
    assert count_pallas_calls(lambda: dmodel.layer_finish(p, dc, x, jnp.zeros((1, 4, 4, 16)))) == []
    # ... while the inference forward under a GPU's "auto" takes the kernels.
    assert "ddtree_add_rms_norm" in count_pallas_calls(
        lambda: tmodel.forward(tp, tc, tokens, jnp.zeros((1, 4), jnp.int32), None, None,
                               tmodel.causal_mask(1, 4), kernels=GPU_KERNELS))
