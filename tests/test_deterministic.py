"""The deterministic mode (KernelTuning.deterministic): a row of a many-row pass computes bit for
bit what a one-row step computes for its token, kernels in interpret mode.

Kernel level: each deterministic kernel's row in a T-row call equals its row in a 1-row call
(bitwise, bf16 and float32) and matches the XLA reference. Target level: the tiny Qwen3 and
Qwen3-MoE targets' verify of a tree gives each row the logits of a one-row decode step of its
token after its ancestors were committed. The GPU path: every kernel lowers for CUDA.
"""
from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.checkpoint import load_checkpoint
from ddtree_jax.kernels import deterministic_attention as det
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels import matmul as mm
from ddtree_jax.kernels import norms
from ddtree_jax.kernels.attention_reference import attention_reference
from ddtree_jax.models import layers
from ddtree_jax.models import target as tmodel
from ddtree_jax.tuning import CPU, CPU_KERNELS, KernelTuning, tuning_for

# rows against one-row steps, bit for bit: under the product's CPU compiler, not the suite's cheapest
pytestmark = pytest.mark.usefixtures("module_default_emitters")
DTYPES = (jnp.bfloat16, jnp.float32)
KERNELS = CPU_KERNELS.as_deterministic(interpret=True)
# A small tree, parents before children: depths up to 5, siblings at several depths.
PARENTS = (-1, 0, 0, 1, 1, 2, 3, 6, 7, 5, 0, 4)


def bits(x) -> np.ndarray:
    """x's bit patterns (equal bits, not just equal values: -0.0 and 0.0 differ)."""
    a = np.asarray(x)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def ancestor_mask(parents) -> np.ndarray:
    t = len(parents)
    mask = np.zeros((t, t), bool)
    for i in range(t):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def rnd(seed: int, shape, dtype, scale: float = 1.0):
    """Host-made normals (no per-shape compile)."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32) * scale, dtype)


# ----------------------------------------------------------------------------- tuning

def test_deterministic_tuning_switches():
    assert KERNELS.deterministic and KERNELS.attention == KERNELS.matmul == KERNELS.norm_impl == "pallas_interpret"
    assert CPU.as_deterministic().kernels == KERNELS     # the CPU runs no Triton: interpreted
    assert KERNELS.with_impls(attention="auto", matmul="auto") == KERNELS
    with pytest.raises(ValueError, match="deterministic mode"):
        KERNELS.with_impls(matmul="xla")
    with pytest.raises(ValueError, match="deterministic mode"):
        dataclasses.replace(KernelTuning(), deterministic=True)
    h100 = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3", compute_capability="9.0",
                                 core_count=132)
    gpu = tuning_for(h100, deterministic=True).kernels
    assert gpu.deterministic and gpu.attention == gpu.matmul == gpu.norm_impl == "pallas"
    # the drafter only shapes the tree: it keeps the device's own kernels
    assert tuning_for(h100, deterministic=True).drafter == tuning_for(h100).kernels
    assert CPU.as_deterministic().drafter == CPU.kernels and CPU.drafter == CPU.kernels
    q, kc = jax.ShapeDtypeStruct((1, 72, 32, 128), jnp.bfloat16), jax.ShapeDtypeStruct((1, 8, 4096, 128), jnp.bfloat16)
    assert dispatch.attention_choice(gpu, q, kc)[0] == "deterministic"          # never Mosaic GPU
    assert dispatch.verify_rows(gpu, 65, 32, 8, 128, jnp.bfloat16, cache_size=4096) == 65   # no padding
    assert dispatch.moe_choice(gpu, 1) == dispatch.moe_choice(gpu, 65) == "deterministic"
    w = jax.ShapeDtypeStruct((4096, 4096), jnp.bfloat16)
    assert dispatch.matmul_choice(gpu, (1, 4096), w) == dispatch.matmul_choice(gpu, (65, 4096), w)


# ----------------------------------------------------------------------------- kernels

SAMPLE = (0, 3, 16, 64, 139)   # rows of a 140-row product: several row tiles, and past MAX_ROWS a row grid


def split_config(monkeypatch, split: int) -> None:
    """deterministic_config with K cut in `split` parts (16-row K steps), as the large shapes are."""
    if split > 1:
        whole = mm.deterministic_config
        monkeypatch.setattr(mm, "deterministic_config",
                            lambda k, n: dataclasses.replace(whole(k, n), block_k=16, split_k=split))


@pytest.mark.parametrize("split", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_row_is_the_one_row_product(monkeypatch, dtype, split):
    k, n = 64, 80                                     # a ragged last column block
    split_config(monkeypatch, split)
    cfg = mm.deterministic_config(k, n)
    assert cfg.split_k == split
    x, w = rnd(0, (140, k), dtype), rnd(1, (k, n), dtype, 0.2)
    nw, res = 1 + rnd(2, (k,), jnp.float32, 0.1), rnd(3, (140, n), dtype)
    gu, wd = rnd(4, (140, 2 * k), dtype), rnd(5, (k, n), dtype, 0.2)

    @jax.jit
    def run(x, res, gu):  # the fused forms the models use: norm prologue + residual, swiglu prologue
        a = mm.matmul(x, w, impl="pallas_interpret", config=cfg, prologue="rmsnorm", norm_w=nw, residual=res)
        b = mm.matmul(gu, wd, impl="pallas_interpret", config=cfg, prologue="swiglu", out_dtype=jnp.float32)
        return a, b

    a, b = run(x, res, gu)
    for r in SAMPLE:
        a1, b1 = run(x[r:r + 1], res[r:r + 1], gu[r:r + 1])
        assert np.array_equal(bits(a[r:r + 1]), bits(a1)) and np.array_equal(bits(b[r:r + 1]), bits(b1)), r
    ref_a = mm.matmul_reference(x, w, prologue="rmsnorm", norm_w=nw, residual=res)
    ref_b = mm.matmul_reference(gu, wd, jnp.float32, prologue="swiglu")
    tol = 3e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(ref_a, np.float32), rtol=tol, atol=tol)
    np.testing.assert_allclose(np.asarray(b, np.float32), np.asarray(ref_b, np.float32), rtol=tol, atol=tol)


def test_matmul_plan_is_row_count_free():
    cfg = mm.deterministic_config(4096, 4096)
    assert (cfg.block_n, cfg.block_k, cfg.split_k, cfg.row_tile) == (64, 128, 4, 16)
    assert mm.deterministic_config(192, 64).block_k == 64 and mm.deterministic_config(192, 64).split_k == 1
    # wide products keep K whole; narrow ones split until enough programs or 1024 K rows a part
    assert mm.deterministic_config(4096, 151936).split_k == 1 and mm.deterministic_config(12288, 4096).split_k == 4
    assert mm.deterministic_config(2048, 128).split_k == 2
    for m in (1, 17, 65, 128, 129, 1024):
        plan = mm.matmul_plan(m, 4096, 4096, cfg)
        assert {h for _, h in plan.tiles} == {16} and plan.block_k == 128 and plan.split_k == 4
        assert plan.row_blocks * plan.rows_per_block >= m and plan.rows_per_block <= mm.MAX_ROWS
    # a program's pipeline fits a Hopper block's shared memory: the 8B down product's swiglu
    # prologue streams gate and up tiles, so it holds fewer rows (257 bf16 rows asked 260 KiB)
    down = mm.deterministic_config(12288, 4096)
    for itemsize, streams, rows in ((2, 1, 128), (2, 2, 64), (4, 1, 32), (4, 2, 16)):
        plan = mm.matmul_plan(257, 12288, 4096, down, itemsize=itemsize, x_streams=streams)
        assert plan.rows_per_block == rows and plan.row_blocks * rows >= 257
        stage = plan.block_k * (plan.block_n + streams * rows) * itemsize
        assert (down.num_stages - 1) * stage <= mm.ROW_TILE_SMEM_BYTES


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_rows_are_one_row_norms(dtype):
    h, heads, kv, dh = 64, 4, 2, 16
    rows = 17
    x, d = rnd(0, (rows, h), dtype), rnd(1, (rows, h), dtype)
    w = 1 + rnd(2, (3, h), jnp.float32, 0.1)
    qkv = rnd(3, (rows, (heads + 2 * kv) * dh), dtype)
    qw, kw = 1 + rnd(4, (3, dh), jnp.float32, 0.1), 1 + rnd(5, (3, dh), jnp.float32, 0.1)
    ang = jnp.arange(rows, dtype=jnp.float32)[:, None] * jnp.linspace(0.01, 1, dh)[None]
    cos, sin = jnp.cos(ang), jnp.sin(ang)
    qk = dict(num_heads=heads, num_kv_heads=kv, head_dim=dh, eps=1e-6, impl="pallas_interpret", layer=1,
              deterministic=True)

    @jax.jit
    def run(x, d, qkv, cos, sin):
        y = norms.rms_norm(x, w, 1e-6, impl="pallas_interpret", layer=2, deterministic=True)
        u = norms.rms_norm(x, w - 1, 1e-6, impl="pallas_interpret", layer=1, deterministic=True, unit_offset=True)
        s, z = norms.add_rms_norm(x, d, w, 1e-6, impl="pallas_interpret", layer=0, deterministic=True)
        return (y, u, s, z, *norms.qk_norm_rope(qkv, qw, kw, cos, sin, **qk))

    many = run(x, d, qkv, cos, sin)
    for r in (0, 4, 16):
        one = run(x[r:r + 1], d[r:r + 1], qkv[r:r + 1], cos[r:r + 1], sin[r:r + 1])
        for a, b in zip(many, one):
            assert np.array_equal(bits(a[r:r + 1]), bits(b)), r
    plain = {k: v for k, v in qk.items() if k not in ("impl", "deterministic")}
    ref = (norms.rms_norm_reference(x, w, 1e-6, layer=2), norms.rms_norm_reference(x, w - 1, 1e-6, layer=1, unit_offset=True),
           *norms.add_rms_norm_reference(x, d, w, 1e-6, layer=0),
           *norms.qk_norm_rope_reference(qkv, qw, kw, cos, sin, **plain))
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    for a, b in zip(many, ref):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_expert_rows_are_one_row_products(dtype):
    """The MoE experts' grouped product: a (token, expert) row's output in a pass of 13 tokens is
    its output in a pass of one, and the plain product of that row alone with the grouped config
    (K whole, whatever the deterministic dense product splits)."""
    e, h, i, k = 8, 64, 32, 2
    assert mm.deterministic_config(2048, 1536).split_k > 1 and mm.grouped_config(2048, 1536).split_k == 1
    gu, dn = rnd(0, (e, h, 2 * i), dtype, 0.2), rnd(1, (e, i, h), dtype, 0.2)
    x, idx = rnd(2, (13, h), dtype), np.random.default_rng(3).integers(0, e, (13, k)).astype(np.int32)

    @jax.jit
    def experts(x, idx):
        dest, groups, tile = dispatch.expert_rows(KERNELS, idx.reshape(-1), e)
        rows = jnp.zeros((groups.shape[0] * tile, h), x.dtype).at[dest].set(jnp.repeat(x, k, axis=0))
        act = dispatch.expert_matmul(KERNELS, rows, gu, groups)
        return dispatch.expert_matmul(KERNELS, act, dn, groups, prologue="swiglu")[dest].reshape(-1, k, h)

    def alone(x, w, **kw):
        return mm.matmul(x, w, impl="pallas_interpret", config=mm.grouped_config(*w.shape), **kw)

    out = experts(x, idx)
    for r in (0, 5, 12):
        assert np.array_equal(bits(out[r:r + 1]), bits(experts(x[r:r + 1], idx[r:r + 1]))), r
        one = alone(alone(x[r:r + 1], gu[idx[r, 1]]), dn[idx[r, 1]], prologue="swiglu")
        assert np.array_equal(bits(out[r:r + 1, 1]), bits(one)), r
    ref = jnp.einsum("nki,nkih->nkh", mm.swiglu(jnp.einsum("nh,nkhi->nki", x, gu[idx])), dn[idx],
                     preferred_element_type=jnp.float32)
    tol = 5e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref), rtol=tol, atol=tol)


def _random_tree(t: int, seed: int) -> tuple[int, ...]:
    rng = np.random.default_rng(seed)
    return (-1,) + tuple(int(rng.integers(max(0, i - 6), i)) for i in range(1, t))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("chunks", [None, (64, 16), (64, 2)])
def test_attention_row_is_the_decode_step(dtype, chunks):
    """A verify row (its ancestors among the new keys) against the one-row step of its token over
    the cache with its ancestors written after the prefix; two batch rows at different lengths,
    whose tails cross a key block. With 64-key chunks a row's keys span up to four chunks, which
    the decode step's shorter grid merges alike; with at most 2, the second takes the rest."""
    hq, hkv, dh, s, n_layers = 4, 2, 16, 192, 2
    lengths = np.array([61, 120], np.int32)        # 61 + depth crosses the 64-key block
    kc, vc = rnd(3, (n_layers, 2, hkv, s, dh), dtype), rnd(4, (n_layers, 2, hkv, s, dh), dtype)
    config = det.DeterministicConfig(*(() if chunks is None else (64, 64, *chunks)))
    call = jax.jit(lambda *a: det.deterministic_attention(*a, scale=0.25, layer=1, interpret=True, config=config))
    reference = jax.jit(lambda *a: attention_reference(*a, scale=0.25, layer=1))
    tol = 2e-2 if dtype == jnp.bfloat16 else 2e-5
    for t, seed in ((1, 0), (5, 1), (65, 3)) if dtype == jnp.bfloat16 else ((17, 2),):
        mask = np.broadcast_to(ancestor_mask(_random_tree(t, seed)), (2, t, t))
        q = rnd(10 + t, (2, t, hq, dh), dtype)
        kn, vn = rnd(11 + t, (2, t, hkv, dh), dtype), rnd(12 + t, (2, t, hkv, dh), dtype)
        out = call(q, kn, vn, kc, vc, lengths, mask)
        want = reference(q, kn, vn, kc, vc, lengths, mask)
        np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol)
        for b, r in ((0, t - 1), (1, t // 2), (0, t // 3)):
            path = [j for j in range(r) if mask[b, r, j]]            # its ancestors, in depth order
            n = int(lengths[b])
            k1, v1 = np.array(kc[:, b:b + 1]), np.array(vc[:, b:b + 1])
            k1[1, 0, :, n:n + len(path)] = np.swapaxes(np.asarray(kn[b, path]), 0, 1)
            v1[1, 0, :, n:n + len(path)] = np.swapaxes(np.asarray(vn[b, path]), 0, 1)
            one = call(q[b:b + 1, r:r + 1], kn[b:b + 1, r:r + 1], vn[b:b + 1, r:r + 1], k1, v1,
                       np.array([n + len(path)], np.int32), np.ones((1, 1, 1), bool))
            assert np.array_equal(bits(out[b:b + 1, r:r + 1]), bits(one)), (t, b, r)


def test_gdn_preorder_is_a_depth_first_order():
    """gdn_recurrence.preorder against a depth-first walk (siblings by index) on random trees,
    with the verify's padding rows after them (roots of their own: parent -1, seeing themselves)."""
    from ddtree_jax.kernels.gdn_recurrence import preorder

    rng = np.random.default_rng(0)
    for n, pad in ((1, 0), (9, 0), (40, 3), (65, 7)):
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n)] + [-1] * pad
        children = {i: [j for j in range(n + pad) if parents[j] == i] for i in range(n + pad)}
        want, stack = [], [r for r in range(n + pad) if parents[r] < 0][::-1]
        while stack:
            want.append(stack.pop())
            stack.extend(children[want[-1]][::-1])
        mask = ancestor_mask(parents)
        order, depth = preorder(jnp.asarray([parents], jnp.int32), jnp.asarray(mask[None]))
        assert np.asarray(order[0]).tolist() == want
        assert np.asarray(depth[0]).tolist() == (mask.sum(-1) - 1).tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_tree_nodes_are_one_node_steps(dtype):
    """The Gated DeltaNet recurrence kernel: a tree node's output is bit for bit a one-node
    call's (a decode step) from its parent's state, the state its root path leaves as a chain
    (the commit's form), and both match the layer's recurrent form in XLA (models.gdn: l2norm,
    the gated delta rule, q^T S); without q, the same states. Two value heads a key head, two
    column blocks a head."""
    from ddtree_jax.kernels.gdn_recurrence import preorder, recurrence
    from ddtree_jax.models import gdn

    bt, hk, hv, dk, dv, n = 2, 2, 4, 16, 64, len(PARENTS)
    q, k, v = rnd(20, (bt, n, hk, dk), dtype), rnd(21, (bt, n, hk, dk), dtype), rnd(22, (bt, n, hv, dv), dtype)
    g = -jnp.abs(rnd(23, (bt, n, hv), jnp.float32, 0.3))
    beta = jax.nn.sigmoid(rnd(24, (bt, n, hv), jnp.float32))
    s0 = rnd(25, (bt, hv, dk, dv), jnp.float32, 0.5)
    call = jax.jit(lambda *a: recurrence(*a, interpret=True))
    parents = np.broadcast_to(np.array(PARENTS, np.int32), (bt, n))
    order, depth = preorder(jnp.asarray(parents), jnp.asarray(np.broadcast_to(ancestor_mask(PARENTS), (bt, n, n))))
    o, states = call(q, k, v, g, beta, order, depth, s0)
    none, states_only = call(None, k, v, g, beta, order, depth, s0)
    assert none is None and np.array_equal(bits(states_only), bits(states))
    cfg = gdn.GdnConfig(hidden=16, num_k_heads=hk, num_v_heads=hv, head_k_dim=dk, head_v_dim=dv)
    node = np.zeros((1, 1), np.int32)                 # a one-node call: node 0 at depth 0
    for b in range(bt):
        for i, p in enumerate(PARENTS):
            path = [j for j in range(i + 1) if ancestor_mask(PARENTS)[i, j]]
            chain = np.arange(len(path), dtype=np.int32)[None]
            _, along = call(None, *(x[b:b + 1, path] for x in (k, v, g, beta)), chain, chain, s0[b:b + 1])
            before = s0[b:b + 1] if p < 0 else along[:, :, len(path) - 2]
            one_o, one_s = call(*(x[b:b + 1, i:i + 1] for x in (q, k, v, g, beta)), node, node, before)
            assert np.array_equal(bits(one_o[0, 0]), bits(o[b, i])), (b, i)
            assert np.array_equal(bits(one_s[0, :, 0]), bits(along[0, :, len(path) - 1])), (b, i)
            qn, kn = (gdn._expand(gdn._l2norm(x[b:b + 1, i].astype(jnp.float32)), cfg) for x in (q, k))
            want = gdn._delta_step(before, kn, v[b:b + 1, i].astype(jnp.float32), g[b:b + 1, i], beta[b:b + 1, i])
            want_o = jnp.einsum("bhk,bhkv->bhv", qn * dk ** -0.5, want, precision="highest")
            np.testing.assert_allclose(np.asarray(one_s[0, :, 0]), np.asarray(want[0]), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(np.asarray(o[b, i]), np.asarray(want_o[0]), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- target

def _first_layers(conv, n: int):
    """The fixture's target in bfloat16, cut to its first n layers (interpret mode is slow), in
    the inference layout."""
    ck = load_checkpoint(conv.out, dtype="bfloat16", with_drafter=False)
    params = {**ck.target_params, "layers": list(ck.target_params["layers"][:n])}
    params = tmodel.fuse_params(jax.tree.map(jnp.asarray, params))
    return params, dataclasses.replace(ck.target_cfg, num_layers=n)


def _verify_rows_are_decode_steps(params, cfg, rows):
    """A verify of PARENTS' tree over two batch rows' prefixes against one-row decode steps of the
    (batch row, node) pairs `rows`, each over the cache with the node's ancestors committed
    (their K/V as the verify made them): logits, and the new K of every layer, bitwise."""
    s, lengths, prompt = 48, np.array([37, 29], np.int32), 37
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, prompt + len(PARENTS)), dtype=np.int32)
    cache = layers.KVCache.zeros(cfg.num_layers, 2, cfg.num_kv_heads, s, cfg.head_dim, jnp.bfloat16)
    pos = np.broadcast_to(np.arange(prompt, dtype=np.int32), (2, prompt))
    _, _, (k, v) = jax.jit(tmodel.forward, static_argnames="cfg")(   # the prefix through XLA's kernels
        params, cfg, tokens[:, :prompt], pos, cache, np.zeros(2, np.int32), tmodel.causal_mask(2, prompt))
    cache = layers.append(cache, k, v, jnp.zeros(2, jnp.int32))

    @jax.jit
    def step(tokens, pos, kc, vc, lengths, mask):
        h, _, (new_k, new_v) = tmodel.forward(params, cfg, tokens, pos, layers.KVCache(kc, vc), lengths, mask,
                                              kernels=KERNELS)
        return tmodel.lm_head(params, cfg, h, kernels=KERNELS), new_k, new_v

    mask = ancestor_mask(PARENTS)
    depth = mask.sum(-1) - 1
    tree = tokens[:, prompt:]
    logits, new_k, new_v = step(tree, lengths[:, None] + depth[None], cache.k, cache.v, lengths,
                                np.broadcast_to(mask, (2,) + mask.shape))
    for b, r in rows:
        path = [j for j in range(r) if mask[r, j]]
        n = int(lengths[b])
        kc, vc = np.array(cache.k[:, b:b + 1]), np.array(cache.v[:, b:b + 1])
        for i in range(cfg.num_layers):
            kc[i, 0, :, n:n + len(path)] = np.swapaxes(np.asarray(new_k[i][b, path]), 0, 1)
            vc[i, 0, :, n:n + len(path)] = np.swapaxes(np.asarray(new_v[i][b, path]), 0, 1)
        one, one_k, _ = step(tree[b:b + 1, r:r + 1], np.array([[n + len(path)]], np.int32), kc, vc,
                          np.array([n + len(path)], np.int32), np.ones((1, 1, 1), bool))
        assert np.array_equal(bits(logits[b:b + 1, r:r + 1]), bits(one)), f"logits of node {r}, batch row {b}"
        for i in range(cfg.num_layers):
            assert np.array_equal(bits(new_k[i][b:b + 1, r:r + 1]), bits(one_k[i])), f"layer {i} K of node {r}"
    return logits


def test_target_verify_rows_are_decode_steps(qwen3_pair):
    params, cfg = _first_layers(qwen3_pair, 2)
    # the layers unfused: the deterministic product takes no norm or silu * up prologue
    assert not dispatch.fuses_prologues(KERNELS)
    assert not tmodel._fused_layers(params, cfg, (2, 16, cfg.hidden_size), KERNELS)
    rows = ((0, 0), (0, 8), (1, 11), (1, 9))          # the root, depth 5, siblings' subtrees
    logits = _verify_rows_are_decode_steps(params, cfg, rows)
    assert np.isfinite(np.asarray(logits)).all()


def test_moe_target_verify_rows_are_decode_steps(qwen3_moe_pair):
    """The same for the tiny Qwen3-MoE target's first layer, an MoE block: each row's experts
    through the grouped deterministic product."""
    params, cfg = _first_layers(qwen3_moe_pair, 1)
    assert cfg.is_moe_layer(0)
    _verify_rows_are_decode_steps(params, cfg, ((0, 8), (1, 11)))


def test_hybrid_target_verify_rows_are_decode_steps(tmp_path):
    """A tiny Qwen3.5-MoE target (a Gated DeltaNet layer, a gated attention layer; experts, a
    shared expert, tied embeddings) in bfloat16: a verify row's logits are bit for bit the last of
    the decode steps along its root path, and the commit of that path leaves those steps' state
    (recurrent state, conv window, K/V), bitwise."""
    from hf_fixtures import make_drafter, make_hybrid_target

    from ddtree_jax.checkpoint import load_hf
    from ddtree_jax.models import hybrid
    from ddtree_jax.models.family import Hybrid

    target = make_hybrid_target(tmp_path / "t", vocab=256, layer_types=["linear_attention", "full_attention"],
                                experts=8, top_k=2, tie=True)
    draft = make_drafter(tmp_path / "d", target, layers=1, block_size=8, target_layer_ids=[0, 1], intermediate=64)
    ck = load_hf(target, draft, dtype="bfloat16")
    params, cfg = Hybrid.fuse_params(jax.tree.map(jnp.asarray, ck.target_params)), ck.target_cfg
    prompt, n = 12, len(PARENTS)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, prompt + n), dtype=np.int32)
    _, _, state = jax.jit(hybrid.prefill, static_argnames="cfg")(    # the prefix through XLA's kernels
        params, cfg, tokens[:, :prompt], hybrid.HybridState.zeros(cfg, 2, 40, jnp.bfloat16))
    mask = ancestor_mask(PARENTS)
    tree = tokens[:, prompt:]
    logits, _, out = jax.jit(lambda *a: hybrid.verify_tree(params, cfg, *a, kernels=KERNELS))(
        tree, np.broadcast_to(np.array(PARENTS, np.int32), (2, n)), np.broadcast_to(mask, (2, n, n)),
        np.broadcast_to(mask.sum(-1).astype(np.int32) - 1, (2, n)), state)
    decode = jax.jit(lambda tok, st: hybrid.decode(params, cfg, tok, st, kernels=KERNELS))
    commit = jax.jit(lambda st, out, path, path_len: hybrid.commit(cfg, st, out, path, path_len, kernels=KERNELS))
    for r in (0, 8, 11):                                     # the root, depth 5, a sibling's subtree
        path = [j for j in range(n) if mask[r, j]]           # root first, r last
        stepped = state
        for j in path:
            one, _, stepped = decode(tree[:, j], stepped)
        assert np.array_equal(bits(logits[:, r]), bits(one)), f"logits of node {r}"
        padded = np.array([path + [0] * (6 - len(path))] * 2, np.int32)    # entries past path_len: any node
        done = commit(state, out, padded, np.full(2, len(path), np.int32))
        assert np.array_equal(done.lengths, stepped.lengths)
        end = prompt + len(path)                             # the commit's writes past it are unread
        for name, a, b in (("rec", done.rec, stepped.rec), ("conv", done.conv, stepped.conv),
                           ("k", done.kv.k[..., :end, :], stepped.kv.k[..., :end, :]),
                           ("v", done.kv.v[..., :end, :], stepped.kv.v[..., :end, :])):
            assert np.array_equal(bits(a), bits(b)), f"{name} after node {r}'s path"


# ----------------------------------------------------------------------------- the GPU path

@pytest.mark.parametrize("t,s,dtype", [(1, 4096, jnp.bfloat16), (65, 4096, jnp.bfloat16), (65, 512, jnp.float32),
                                       (17, 48, jnp.bfloat16)])
def test_triton_lowering_verifies(monkeypatch, t, s, dtype):
    """The deterministic kernels lower for CUDA (Triton dialect) and every module verifies, on a
    CPU machine, at the 8B shape's heads: the attention (its chunks' folds and their merge), a
    fused product, a grouped expert product, the q/k norm + RoPE, Qwen3.5's norm and the Gated
    DeltaNet recurrence (Qwen3.5-9B's 16 key and 32 value heads of 128)."""
    from test_kernels import _verified_triton_modules

    modules = _verified_triton_modules(monkeypatch)
    gpu = dataclasses.replace(KERNELS, attention="pallas", norms="pallas", matmul="pallas")
    sds = jax.ShapeDtypeStruct
    hq, hkv, dh, h = 32, 8, 128, 4096

    def fn(q, kn, vn, kc, vc, lengths, mask, x, w, nw, ew, groups, qkv, cos, s0):
        o = dispatch.attention(gpu, q, kn, vn, kc, vc, lengths, mask, scale=dh ** -0.5, layer=1)
        y = dispatch.matmul(gpu, x, w, prologue="rmsnorm", norm_w=nw, residual=x)
        e = dispatch.expert_matmul(gpu, jnp.zeros((16 * groups.shape[0], h), x.dtype), ew, groups)
        u = dispatch.rms_norm(gpu, x, nw, 1e-6, unit_offset=True)
        qk = q[:, :, :16]                                  # [1, t, 16, 128]: the key heads' q and k
        gates = cos[None, :, :32]                          # [1, t, 32]: per value head
        idx = mask[:, 0].astype(jnp.int32)                  # [1, t]: the order and depths' shape
        rec = dispatch.gdn_recurrence(gpu, qk, qk, q, gates, gates, idx, idx, s0)
        return o, y, e, u, rec, dispatch.qk_norm_rope(gpu, qkv, nw[:dh], nw[:dh], cos, cos, num_heads=hq,
                                                      num_kv_heads=hkv, head_dim=dh, eps=1e-6)

    args = (sds((1, t, hq, dh), dtype), sds((1, t, hkv, dh), dtype), sds((1, t, hkv, dh), dtype),
            sds((2, 1, hkv, s, dh), dtype), sds((2, 1, hkv, s, dh), dtype), sds((1,), jnp.int32), sds((1, t, t), bool),
            sds((t, h), dtype), sds((h, h), dtype), sds((h,), dtype), sds((4, h, 256), dtype), sds((3,), jnp.int32),
            sds((t, (hq + 2 * hkv) * dh), dtype), sds((t, dh), jnp.float32), sds((1, hq, dh, dh), jnp.float32))
    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
    assert len(modules) == 7
    for module in modules:
        assert module.operation.verify()


def test_greedy_ddtree_equals_ar_in_bfloat16(qwen3_pair):
    """The product's promise: with `deterministic=True`, greedy DDTree gives AR's tokens in
    bfloat16. The drafter is an oracle of AR's continuation (tests/tiny.py), so rounds
    accept deep paths and most tokens come from verify rows."""
    from ddtree_jax.generator import Generator
    from tiny import oracle_extra, oracle_params

    ck = load_checkpoint(qwen3_pair.out, dtype="bfloat16")
    prompts, new = [[5, 17, 3, 99, 42, 7, 250, 11], [9, 8, 7]], 10
    ar = Generator(ck, method="ar", deterministic=True)
    assert ar.tuning.kernels.deterministic
    greedy = [r.token_ids for r in ar.generate_ids(prompts, max_new_tokens=new + oracle_extra(ck))]
    oracle = oracle_params(ck, prompts, new, greedy=greedy)
    res = Generator(ck, method="ddtree", budget=8, oracle=oracle, deterministic=True).generate_ids(
        prompts, max_new_tokens=new)
    assert [r.token_ids for r in res] == [g[:new] for g in greedy]
    assert max(a for r in res for a in r.acceptance_lengths) > 2  # rounds committed verify rows' tokens


def test_sampled_ddtree_equals_ar_in_bfloat16(qwen3_pair):
    """Sampling draws each position's token with that position's noise (sampling.py), so with the
    deterministic kernels a seed gives AR's sampled text under DDTree too. The oracle drafter
    proposes AR's sampled continuation: rounds accept deep paths of sampled tokens only if the
    verify rows draw what AR's steps drew."""
    from ddtree_jax.generator import Generator
    from tiny import oracle_extra, oracle_params

    ck = load_checkpoint(qwen3_pair.out, dtype="bfloat16")
    prompts, new = [[5, 17, 3, 99, 42, 7, 250, 11], [9, 8, 7]], 10
    kw = dict(temperature=0.9, top_k=50, top_p=0.95, seed=3)
    ar = [r.token_ids for r in Generator(ck, method="ar", deterministic=True).generate_ids(
        prompts, max_new_tokens=new + oracle_extra(ck), **kw)]
    oracle = oracle_params(ck, prompts, new, greedy=ar)
    res = Generator(ck, method="ddtree", budget=8, oracle=oracle, deterministic=True).generate_ids(
        prompts, max_new_tokens=new, **kw)
    assert [r.token_ids for r in res] == [a[:new] for a in ar]
    assert max(a for r in res for a in r.acceptance_lengths) > 2


def test_greedy_ddtree_equals_ar_on_a_hybrid_target_in_bfloat16(tmp_path):
    """The same for a tiny Qwen3.5 target (Gated DeltaNet and gated attention layers): each round's
    commit steps the accepted path's recurrence again, so later rounds start from AR's states."""
    from hf_fixtures import make_drafter, make_hybrid_target

    from ddtree_jax.checkpoint import load_hf
    from ddtree_jax.generator import Generator
    from tiny import oracle_extra, oracle_params

    target = make_hybrid_target(tmp_path / "t", vocab=256, layer_types=["linear_attention", "full_attention"])
    ck = load_hf(target, make_drafter(tmp_path / "d", target, layers=1, block_size=8, target_layer_ids=[0, 1]),
                 dtype="bfloat16")
    prompts, new = [[5, 17, 3, 99, 42, 7, 250, 11], [9, 8, 7]], 10
    greedy = [r.token_ids for r in Generator(ck, method="ar", deterministic=True).generate_ids(
        prompts, max_new_tokens=new + oracle_extra(ck))]
    oracle = oracle_params(ck, prompts, new, greedy=greedy)
    res = Generator(ck, method="ddtree", budget=8, oracle=oracle, deterministic=True).generate_ids(
        prompts, max_new_tokens=new)
    assert [r.token_ids for r in res] == [g[:new] for g in greedy]
    assert max(a for r in res for a in r.acceptance_lengths) > 2
