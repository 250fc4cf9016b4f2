"""Gated DeltaNet (Qwen3.5's linear attention, ddtree_jax.models.gdn) against transformers.

A tiny transformers Qwen3_5GatedDeltaNet layer (float32, weights drawn so that decays, betas and
the conv all matter, some heads keeping memory across chunks) is mapped into our layout: the
chunked prefill, its continuation over a cache and step-by-step decode match the layer and the
states its cache holds; a tree verify gives every node the output of stepping its root path
after the prefix, and both commits give the states of stepping the accepted path; a chain tree
is a prefill; right padding leaves the states alone; bad configs are one ConfigError.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_5")

from ddtree_jax.errors import ConfigError  # noqa: E402
from ddtree_jax.models import gdn  # noqa: E402

HIDDEN = 24
# dk != dv and two value heads a key head: a transposed state or a wrong grouping shows up
SIZES = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
             linear_conv_kernel_dim=4)
PREFIX = 150  # > 2 chunks of 64, not a multiple of one

prefill = jax.jit(gdn.prefill, static_argnames=("cfg", "kernels"))
step = jax.jit(gdn.step, static_argnames=("cfg", "kernels"))
tree_verify = jax.jit(gdn.tree_verify, static_argnames=("cfg", "kernels"))
path_states = jax.jit(gdn.path_states, static_argnames=("cfg",))
path_states_parallel = jax.jit(gdn.path_states_parallel, static_argnames=("cfg",))


def _hf_config():
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    return Qwen3_5TextConfig(vocab_size=32, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6,
                             layer_types=["linear_attention"], **SIZES)


@pytest.fixture(scope="module")
def layer():
    """(transformers layer, its HF config, our GdnConfig, our params)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    hf_cfg = _hf_config()
    torch.manual_seed(0)
    mod = Qwen3_5GatedDeltaNet(hf_cfg, 0).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, w in mod.named_parameters():
            if name == "A_log":  # decay rates 0.02..0.8: some heads remember across chunks
                w.copy_(torch.log(0.02 + 0.78 * torch.rand(w.shape, generator=gen)))
            elif name == "dt_bias":
                w.copy_(0.5 * torch.randn(w.shape, generator=gen))
            elif name == "norm.weight":
                w.copy_(1.0 + 0.1 * torch.randn(w.shape, generator=gen))
            elif name == "conv1d.weight":
                w.copy_(0.6 * torch.randn(w.shape, generator=gen))
            else:  # projections: unit gain over the fan-in
                w.copy_(torch.randn(w.shape, generator=gen) / w.shape[-1] ** 0.5)
    cfg = gdn.GdnConfig.from_hf(hf_cfg.to_dict())
    weights = {k: v.detach().numpy() for k, v in mod.state_dict().items()}
    params = jax.tree.map(jnp.asarray, gdn.params_from_hf(weights, cfg))
    return mod, hf_cfg, cfg, params


def _inputs(seed: int, *shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _hf_run(mod, cache, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return mod(torch.from_numpy(x), cache=cache).numpy()


def _hf_states(cache):
    """transformers' cache as our (conv_state [Bt, K-1, C], rec_state)."""
    lay = cache.layers[0]
    return lay.conv_states[0].numpy()[:, :, 1:].transpose(0, 2, 1), lay.recurrent_states[0].numpy()


def _close(got, want, rel: float = 1e-5):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"


def test_prefill_and_decode_match_transformers(layer):
    from transformers.cache_utils import DynamicCache

    mod, hf_cfg, cfg, params = layer
    x = _inputs(0, 2, PREFIX, HIDDEN)
    cache = DynamicCache(config=hf_cfg)
    y_hf = _hf_run(mod, cache, x)
    conv_hf, rec_hf = _hf_states(cache)
    y, conv, rec = prefill(params, cfg, jnp.asarray(x))
    _close(y, y_hf)
    _close(rec, rec_hf)
    _close(conv, conv_hf, 1e-6)
    assert np.abs(rec_hf).max() > 0.1  # the state carries something

    # decode one token at a time over transformers' cache (its recurrent path)
    xs = _inputs(1, 2, 5, HIDDEN)
    for t in range(xs.shape[1]):
        y_hf = _hf_run(mod, cache, xs[:, t:t + 1])[:, 0]
        y, conv, rec = step(params, cfg, jnp.asarray(xs[:, t]), conv, rec)
        _close(y, y_hf)
    conv_hf, rec_hf = _hf_states(cache)
    _close(rec, rec_hf)
    _close(conv, conv_hf, 1e-6)

    # a second prompt piece over the cache (transformers' chunked form with an initial state)
    x2 = _inputs(2, 2, 70, HIDDEN)
    y_hf = _hf_run(mod, cache, x2)
    y, conv, rec = prefill(params, cfg, jnp.asarray(x2), conv, rec)
    _close(y, y_hf)
    conv_hf, rec_hf = _hf_states(cache)
    _close(rec, rec_hf)
    _close(conv, conv_hf, 1e-6)


def test_right_padding_leaves_states(layer):
    _, _, cfg, params = layer
    x = _inputs(3, 2, 80, HIDDEN)
    lengths = np.array([80, 67], np.int32)
    y, conv, rec = prefill(params, cfg, jnp.asarray(x), lengths=jnp.asarray(lengths))
    for b, n in enumerate(lengths):
        yb, convb, recb = prefill(params, cfg, jnp.asarray(x[b:b + 1, :n]))
        _close(y[b, :n], yb[0])
        _close(rec[b], recb[0])
        _close(conv[b], convb[0], 1e-6)


def _random_tree(rng, n: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """parents [n] (root 0, parents before children) reaching `depth`, branching; and depths."""
    parents, depths = [-1], [0]
    for i in range(1, n):
        if i <= depth:  # one chain down to `depth`, then branches anywhere above it
            p = i - 1
        else:
            p = int(rng.choice([j for j in range(i) if depths[j] < depth]))
        parents.append(p)
        depths.append(depths[p] + 1)
    order = list(range(1, n))
    rng.shuffle(order)
    # renumber in a random topological order (children still after parents)
    new, placed = [0], {0}
    while len(new) < n:
        for j in order:
            if j not in placed and parents[j] in placed:
                new.append(j)
                placed.add(j)
                break
    where = {old: k for k, old in enumerate(new)}
    par = np.array([-1] + [where[parents[old]] for old in new[1:]], np.int32)
    dep = np.array([depths[old] for old in new], np.int32)
    return par, dep


def _root_path(parents: np.ndarray, i: int) -> list[int]:
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


def _step_path(params, cfg, xs: np.ndarray, conv, rec):
    """Step one row (conv [1, K-1, C], rec [1, ...]) over xs [P, H]: the last output and the states."""
    for x in xs:
        y, conv, rec = step(params, cfg, jnp.asarray(x[None]), conv, rec)
    return y[0], conv, rec


def test_tree_verify_matches_stepping_each_root_path(layer):
    _, _, cfg, params = layer
    n, depth = 12, 4
    rng = np.random.default_rng(7)
    trees = [_random_tree(rng, n, depth) for _ in range(2)]
    assert not np.array_equal(trees[0][0], trees[1][0])
    parents = np.stack([t[0] for t in trees])
    _, conv0, rec0 = prefill(params, cfg, jnp.asarray(_inputs(4, 2, PREFIX, HIDDEN)))
    x = _inputs(5, 2, n, HIDDEN)
    y, tree = tree_verify(params, cfg, jnp.asarray(x), jnp.asarray(parents), conv0, rec0)
    y_fresh, _ = tree_verify(params, cfg, jnp.asarray(x), jnp.asarray(parents), conv0, jnp.zeros_like(rec0))
    assert np.abs(np.asarray(y) - np.asarray(y_fresh)).max() > 1e-2  # the pre-round state matters

    for b in range(2):
        for i in range(n):
            path = _root_path(parents[b], i)
            want, _, _ = _step_path(params, cfg, x[b, path], conv0[b:b + 1], rec0[b:b + 1])
            _close(y[b, i], want)

    # the accepted paths: row 0 down to a deepest node (D+1 = 5 nodes), row 1 root + 2 nodes
    deepest = int(np.argmax(trees[0][1]))
    mid = int(np.flatnonzero(trees[1][1] == 2)[0])
    paths = [_root_path(parents[0], deepest), _root_path(parents[1], mid)]
    path_len = np.array([len(p) for p in paths], np.int32)
    path = np.zeros((2, depth + 1), np.int32)
    for b, p in enumerate(paths):
        path[b, :len(p)] = p
    assert path_len.tolist() == [depth + 1, 3]
    args = (cfg, tree, jnp.asarray(path), jnp.asarray(path_len), conv0, rec0)
    for commit in (path_states, path_states_parallel):
        conv, rec = commit(*args)
        for b, p in enumerate(paths):
            _, conv_b, rec_b = _step_path(params, cfg, x[b, p], conv0[b:b + 1], rec0[b:b + 1])
            _close(rec[b], rec_b[0])
            _close(conv[b], conv_b[0], 1e-6)
        # and decoding on from the committed states is decoding on from the stepped ones
        nxt = _inputs(6, 2, HIDDEN)
        y_next, _, _ = step(params, cfg, jnp.asarray(nxt), conv, rec)
        for b, p in enumerate(paths):
            _, conv_b, rec_b = _step_path(params, cfg, x[b, p], conv0[b:b + 1], rec0[b:b + 1])
            want, _, _ = step(params, cfg, jnp.asarray(nxt[b:b + 1]), conv_b, rec_b)
            _close(y_next[b], want[0])


def test_qkv_groups_reorder_the_channels_not_the_results(layer):
    """--tp's layout (gdn.group_qkv): the conv channels in 2 blocks of [q | k | v] heads. Prefill,
    step, a tree verify and its commit give the same outputs and recurrent states; the conv
    state holds the same channels in the new order."""
    _, _, cfg, params = layer
    two = dataclasses.replace(cfg, qkv_groups=2)
    order = gdn.qkv_order(two)
    assert sorted(order) == list(range(cfg.conv_dim)) and list(order) != list(range(cfg.conv_dim))
    grouped = jax.tree.map(jnp.asarray, gdn.group_qkv(jax.tree.map(np.asarray, params), two))
    x = jnp.asarray(_inputs(10, 2, 70, HIDDEN))
    (y, conv, rec), (y2, conv2, rec2) = prefill(params, cfg, x), prefill(grouped, two, x)
    _close(y2, y)
    _close(rec2, rec)
    np.testing.assert_array_equal(conv2, conv[..., order])
    t = jnp.asarray(_inputs(11, 2, HIDDEN))
    (y, c, r), (y2, c2, r2) = step(params, cfg, t, conv, rec), step(grouped, two, t, conv2, rec2)
    _close(y2, y)
    _close(r2, r)
    np.testing.assert_array_equal(c2, c[..., order])
    parents = jnp.asarray(np.stack([_random_tree(np.random.default_rng(s), 8, 3)[0] for s in (1, 2)]))
    nodes = jnp.asarray(_inputs(12, 2, 8, HIDDEN))
    (y, tree), (y2, tree2) = tree_verify(params, cfg, nodes, parents, conv, rec), \
        tree_verify(grouped, two, nodes, parents, conv2, rec2)
    _close(y2, y)
    path, path_len = jnp.asarray([[0, 1, 0, 0], [0, 0, 0, 0]], jnp.int32), jnp.asarray([2, 1], jnp.int32)
    _close(path_states_parallel(two, tree2, path, path_len, conv2, rec2)[1],
           path_states_parallel(cfg, tree, path, path_len, conv, rec)[1])


def test_chain_tree_is_prefill(layer):
    _, _, cfg, params = layer
    n = 12
    _, conv0, rec0 = prefill(params, cfg, jnp.asarray(_inputs(8, 2, 70, HIDDEN)))
    x = jnp.asarray(_inputs(9, 2, n, HIDDEN))
    parents = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32) - 1, (2, n))
    y_tree, tree = tree_verify(params, cfg, x, parents, conv0, rec0)
    y, conv, rec = prefill(params, cfg, x, conv0, rec0)
    _close(y_tree, y)
    path = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (2, n))
    conv_p, rec_p = path_states_parallel(cfg, tree, path, jnp.full((2,), n, jnp.int32), conv0, rec0)
    _close(rec_p, rec)
    _close(conv_p, conv, 1e-6)


def test_engine_tree_conventions(layer):
    """The engine's trees: padding nodes (parent 0) and its ancestor mask leave real nodes alone."""
    from ddtree_jax.trees.base import ancestor_mask_from_parents

    _, _, cfg, params = layer
    _, conv0, rec0 = prefill(params, cfg, jnp.asarray(_inputs(10, 1, 20, HIDDEN)))
    parents = jnp.asarray([[-1, 0, 1, 0, 2]], jnp.int32)
    x = jnp.asarray(_inputs(11, 1, 5, HIDDEN))
    y, _ = tree_verify(params, cfg, x, parents, conv0, rec0)
    padded = jnp.asarray([[-1, 0, 1, 0, 2, 0, 0]], jnp.int32)  # two padding nodes under the root
    xp = jnp.concatenate([x, jnp.asarray(_inputs(12, 1, 2, HIDDEN))], axis=1)
    mask = ancestor_mask_from_parents(padded, 3)
    yp, _ = tree_verify(params, cfg, xp, padded, conv0, rec0, mask)
    _close(yp[:, :5], y, 1e-6)


def test_config_from_hf_and_errors():
    d = _hf_config().to_dict()
    cfg = gdn.GdnConfig.from_hf(d)
    assert (cfg.hidden, cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_kernel) == \
        (HIDDEN, 2, 4, 16, 8, 4)
    assert cfg.conv_dim == 2 * 2 * 16 + 4 * 8 and cfg.group == 2
    # a multimodal qwen3_5 config.json nests the text model's fields
    assert gdn.GdnConfig.from_hf({"model_type": "qwen3_5", "text_config": d}) == cfg

    bad = [({**d, "linear_num_value_heads": 3}, "not a multiple"),
           ({**d, "linear_key_head_dim": 0}, "linear_key_head_dim is 0"),
           ({**d, "linear_conv_kernel_dim": 2.5}, "linear_conv_kernel_dim is 2.5"),
           ({**d, "hidden_act": "gelu"}, "hidden_act"),
           ({k: v for k, v in d.items() if k != "linear_num_key_heads"}, "lacks the field 'linear_num_key_heads'"),
           ({"text_config": {**d, "rms_norm_eps": -1}}, "text_config.rms_norm_eps is -1")]
    for cfg_dict, msg in bad:
        with pytest.raises(ConfigError, match=msg) as e:
            gdn.GdnConfig.from_hf(cfg_dict)
        assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="num_v_heads"):
        gdn.GdnConfig(hidden=8, num_k_heads=3, num_v_heads=4, head_k_dim=4, head_v_dim=4)
    with pytest.raises(ConfigError, match="2 qkv groups do not divide 3 key heads"):
        gdn.GdnConfig(hidden=8, num_k_heads=3, num_v_heads=6, head_k_dim=4, head_v_dim=4, qkv_groups=2)
    with pytest.raises(ConfigError, match="has shape"):
        gdn.params_from_hf({"in_proj_qkv.weight": np.zeros((3, 3))}, cfg)


@pytest.mark.parametrize("n", [1, 2, 17, 64, 65])
def test_unit_lower_solve_matches_a_float64_solve(n):
    """The parallel form's unit-lower-triangular solve against numpy's in float64, on
    the delta rule's matrices (unit keys, betas in (0, 1), decays), a chain's and a tree's mask."""
    rng = np.random.default_rng(n)
    k = rng.standard_normal((3, n, 16))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta = 1 / (1 + np.exp(-rng.standard_normal((3, n))))
    cum = np.cumsum(-0.1 * np.abs(rng.standard_normal((3, n))), axis=-1)
    chain = np.tril(np.ones((n, n), bool))
    parents = [max(0, i - 1 - (i % 3 == 0)) for i in range(n)]   # some nodes share a parent
    tree = np.eye(n, dtype=bool)
    for i in range(1, n):
        tree[i] |= tree[parents[i]]
    for mask in (chain, tree):
        decay = np.exp(np.where(mask, cum[..., :, None] - cum[..., None, :], -np.inf))
        lower = (k * beta[..., None]) @ k.transpose(0, 2, 1) * decay
        rhs = rng.standard_normal((3, n, 24))
        want = np.linalg.solve(np.tril(lower, -1) + np.eye(n), rhs)
        got = gdn._unit_lower_solve(jnp.asarray(lower, jnp.float32), jnp.asarray(rhs, jnp.float32))
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=2e-6 * max(1.0, np.abs(want).max()))
