"""Mixture-of-experts targets (Qwen3-MoE, Qwen2-MoE with a shared expert) against transformers.

Tiny random transformers models are built here (float32, weights drawn with enough spread that
routing is decisive) and their parameters mapped into our layout in memory (no converter):
logits and tapped hidden states of a prefill and of a tree-shaped verify over a cache match
transformers on the corresponding sequences; greedy tokens match transformers' generate; the
inference layout (fuse_params), the fused GPU layer path (interpreted) and the grouped
ragged_dot experts match plain references; the round is lossless with an MoE target.
"""
from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from ddtree_jax.generator import Generator
from ddtree_jax.models import moe
from ddtree_jax.models import target as tmodel
from ddtree_jax.models.config import DrafterConfig, MoeConfig, TargetConfig
from ddtree_jax.models.init import init_drafter, init_target
from ddtree_jax.models.layers import KVCache, append
from ddtree_jax.tuning import CPU_KERNELS, Tuning

VOCAB, HIDDEN, EXPERTS, TOP_K = 96, 32, 8, 2
# one compiled forward per shape: op by op, a tiny forward's dispatches cost seconds
forward = jax.jit(tmodel.forward, static_argnames=("cfg", "taps", "kernels", "moe_stats"))

# name -> (transformers class name, config kwargs)
MODELS = {
    # layer 0 dense (mlp_only_layers), layers 1-2 sparse; weights renormalised over the k
    "qwen3_norm": ("Qwen3Moe", dict(norm_topk_prob=True, mlp_only_layers=[0], head_dim=8)),
    "qwen3_raw": ("Qwen3Moe", dict(norm_topk_prob=False, mlp_only_layers=[1], head_dim=8)),
    # a shared expert behind its sigmoid gate, q/k/v biases
    "qwen2_shared": ("Qwen2Moe", dict(norm_topk_prob=False, shared_expert_intermediate_size=24)),
}


def _hf_model(name: str, seed: int = 0):
    """A tiny transformers MoE model with well-spread random weights, and its TargetConfig."""
    import transformers

    kind, extra = MODELS[name]
    cfg = getattr(transformers, f"{kind}Config")(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, num_experts=EXPERTS, num_experts_per_tok=TOP_K,
        max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=False, **extra)
    model = getattr(transformers, f"{kind}ForCausalLM")(cfg)
    model.config._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, w in model.named_parameters():
            if pname.endswith("mlp.gate.weight"):      # the router: decisive top-k choices
                std = 3.0 / HIDDEN**0.5
            elif "norm" in pname:
                w.copy_(1.0 + 0.1 * torch.randn(w.shape, generator=gen))
                continue
            elif "embed" in pname:
                std = 1.0
            else:                                     # [.., out, in] weights: unit-variance outputs
                std = w.shape[-1] ** -0.5 if w.ndim > 1 else 0.1
            w.copy_(std * torch.randn(w.shape, generator=gen))
    model.eval()
    d = cfg.to_dict()
    d["architectures"] = [f"{kind}ForCausalLM"]
    return model, TargetConfig.from_hf(d, where=name)


def _t(x) -> jnp.ndarray:
    return jnp.asarray(x.detach().numpy())


def ours_from_hf(model, cfg: TargetConfig) -> dict:
    """transformers' named parameters in our target layout (weights [in, out]; experts [E, in, out])."""
    sd = model.state_dict()
    layers = []
    for i in range(cfg.num_layers):
        pre = f"model.layers.{i}."
        p = {"attn_norm": _t(sd[pre + "input_layernorm.weight"]),
             "mlp_norm": _t(sd[pre + "post_attention_layernorm.weight"])}
        for ours, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj")):
            p[ours] = _t(sd[f"{pre}self_attn.{theirs}.weight"]).T
            if f"{pre}self_attn.{theirs}.bias" in sd:
                p[f"{ours}_bias"] = _t(sd[f"{pre}self_attn.{theirs}.bias"])
        if cfg.qk_norm:
            p["q_norm"] = _t(sd[pre + "self_attn.q_norm.weight"])
            p["k_norm"] = _t(sd[pre + "self_attn.k_norm.weight"])
        if cfg.is_moe_layer(i):
            ie = cfg.moe.expert_intermediate
            gate_up = _t(sd[pre + "mlp.experts.gate_up_proj"])            # [E, 2 Ie, H], gate then up
            p["router"] = _t(sd[pre + "mlp.gate.weight"]).T
            p["experts_gate"] = jnp.swapaxes(gate_up[:, :ie], 1, 2)
            p["experts_up"] = jnp.swapaxes(gate_up[:, ie:], 1, 2)
            p["experts_down"] = jnp.swapaxes(_t(sd[pre + "mlp.experts.down_proj"]), 1, 2)   # [E, H, Ie] -> [E, Ie, H]
            if cfg.moe.shared_intermediate:
                for ours, theirs in (("shared_gate", "gate_proj"), ("shared_up", "up_proj"),
                                     ("shared_down", "down_proj")):
                    p[ours] = _t(sd[f"{pre}mlp.shared_expert.{theirs}.weight"]).T
                p["shared_expert_gate"] = _t(sd[pre + "mlp.shared_expert_gate.weight"]).T
        else:
            for ours in ("gate", "up", "down"):
                p[ours] = _t(sd[f"{pre}mlp.{ours}_proj.weight"]).T
        layers.append(p)
    return {"embed": _t(sd["model.embed_tokens.weight"]), "norm": _t(sd["model.norm.weight"]),
            "lm_head": _t(sd["lm_head.weight"]).T, "layers": layers}


@pytest.fixture(scope="module", params=list(MODELS))
def hf_pair(request):
    model, cfg = _hf_model(request.param)
    return request.param, model, cfg, ours_from_hf(model, cfg)


def _close(ours, ref, what, tol=1e-4):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    err = np.max(np.abs(ours - ref))
    assert err <= tol * max(1.0, np.max(np.abs(ref))), \
        f"{what}: max abs diff {err:.3g}, max |ref| {np.max(np.abs(ref)):.3g}"


def _count(params: dict) -> int:
    """Weights as config.num_params counts them: no q/k norms, no biases."""
    leaves = jax.tree_util.tree_leaves_with_path(params)
    skip = lambda path: any(str(getattr(k, "key", "")).endswith(("_norm", "_bias")) and
                            str(getattr(k, "key", "")) not in ("attn_norm", "mlp_norm") for k in path)
    return sum(x.size for path, x in leaves if not skip(path))


def _hf_out(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens)), output_hidden_states=True)


def test_config_and_layout(hf_pair):
    name, _, cfg, params = hf_pair
    assert cfg.moe is not None and cfg.moe.num_experts == EXPERTS and cfg.moe.top_k == TOP_K
    want = {"qwen3_norm": (False, True, True), "qwen3_raw": (True, False, True), "qwen2_shared": (True, True, True)}
    assert cfg.moe.sparse_layers == want[name]
    assert _count(params) == cfg.num_params


def test_prefill_logits_and_taps_match_transformers(hf_pair):
    """A causal pass without a cache: logits, every tap (hidden_states[i + 1], the last final-normed)."""
    name, model, cfg, params = hf_pair
    tokens = np.random.default_rng(1).integers(0, VOCAB, size=(2, 13))
    out = _hf_out(model, tokens)
    taps = tuple(range(cfg.num_layers))
    logits, hidden = tmodel.forward_train(params, cfg, jnp.asarray(tokens, jnp.int32), taps=taps)
    _close(logits, out.logits.numpy(), f"{name} logits")
    for i in taps:
        _close(hidden[..., i * HIDDEN:(i + 1) * HIDDEN], out.hidden_states[i + 1].numpy(), f"{name} tap {i}")
    # the inference layout (fused q/k/v, gate/up, experts' gate/up, stacked norms) computes the same
    fused = tmodel.fuse_params(params)
    assert "experts_gate_up" in fused["layers"][list(cfg.moe.sparse_layers).index(True)]
    flog, fhid = tmodel.forward_train(fused, cfg, jnp.asarray(tokens, jnp.int32), taps=taps)
    np.testing.assert_allclose(np.asarray(flog), np.asarray(logits), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(fhid), np.asarray(hidden), rtol=1e-5, atol=1e-5)


# A tree under the root: node -> parent (-1: the root, row 0), depths follow
PARENTS = [-1, 0, 0, 1, 1, 2, 4]


def test_tree_verify_over_a_cache_matches_transformers(hf_pair):
    """Prefill two prompts of different lengths into a cache, then one verify pass over [root;
    tree] with the ancestor mask: each node's logits and taps are transformers' at the end of
    prompt + root + the node's path. Both layouts (unfused, fused)."""
    name, model, cfg, params = hf_pair
    rng = np.random.default_rng(2)
    lens = [9, 6]
    prompt = rng.integers(0, VOCAB, size=(2, max(lens)))
    tree_tokens = rng.integers(0, VOCAB, size=(2, 1 + len(PARENTS)))        # row 0 the root
    parents = [None] + [p + 1 for p in PARENTS]
    paths = [[0]]
    for j in range(1, len(parents)):
        paths.append(paths[parents[j]] + [j])
    t = len(parents)
    anc = np.zeros((t, t), bool)
    for j, path in enumerate(paths):
        anc[j, path] = True
    depths = np.array([len(path) - 1 for path in paths])
    taps = tuple(range(cfg.num_layers))
    # transformers over prompt + each leaf's path: every node's reference is a position of one of them
    leaves = [j for j in range(t) if j not in parents]
    ref_logits = np.zeros((2, t, VOCAB))
    ref_taps = np.zeros((2, t, cfg.num_layers, HIDDEN))
    for b in range(2):
        for leaf in leaves:
            path = paths[leaf]
            out = _hf_out(model, np.concatenate([prompt[b, :lens[b]], tree_tokens[b, path]])[None])
            ref_logits[b, path] = out.logits[0, lens[b]:].numpy()
            ref_taps[b, path] = np.stack([out.hidden_states[i + 1][0, lens[b]:].numpy() for i in taps], axis=1)
    for layout in (params, tmodel.fuse_params(params)):
        cache = KVCache.zeros(cfg.num_layers, 2, cfg.num_kv_heads, 32, cfg.head_dim, jnp.float32)
        pos = jnp.broadcast_to(jnp.arange(max(lens), dtype=jnp.int32), (2, max(lens)))
        zero = jnp.zeros((2,), jnp.int32)
        _, _, kv = forward(layout, cfg, jnp.asarray(prompt, jnp.int32), pos, cache, zero,
                           tmodel.causal_mask(2, max(lens)))
        cache = append(cache, *kv, zero)
        length = jnp.asarray(lens, jnp.int32)
        vpos = length[:, None] + jnp.asarray(depths, jnp.int32)[None]
        mask = jnp.broadcast_to(jnp.asarray(anc), (2, t, t))
        h, tapped, _ = forward(layout, cfg, jnp.asarray(tree_tokens, jnp.int32), vpos, cache, length, mask, taps=taps)
        _close(tmodel.lm_head(layout, cfg, h), ref_logits, f"{name} verify logits")
        _close(np.asarray(tapped).reshape(2, t, cfg.num_layers, HIDDEN), ref_taps, f"{name} verify taps")


def _namespace(cfg: TargetConfig, params: dict, seed: int = 0, block_size: int = 8):
    """An in-memory checkpoint (as tests/tiny.py's): the target and a random DFlash drafter."""
    dc = DrafterConfig(hidden_size=cfg.hidden_size, intermediate_size=48, num_layers=1, num_heads=4, num_kv_heads=2,
                       head_dim=8, rms_eps=1e-6, block_size=block_size, target_layer_ids=(0, cfg.num_layers - 1),
                       mask_token_id=cfg.vocab_size - 1, num_target_layers=cfg.num_layers,
                       vocab_size=cfg.vocab_size, sliding_windows=(None,))
    dp = init_drafter(dc, jax.random.PRNGKey(seed + 1))
    return types.SimpleNamespace(target_cfg=cfg, target_params=params, drafter_cfg=dc, drafter_params=dp,
                                 tokenizer_dir=None, meta={})


def test_greedy_generation_matches_transformers(hf_pair):
    name, model, cfg, params = hf_pair
    prompt = [5, 17, 42, 7, 91, 3]
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    ours = Generator(_namespace(cfg, params), method="ar").generate_ids([prompt], max_new_tokens=20)[0].token_ids
    assert ours == ref[0, len(prompt):].tolist()


# --------------------------------------------------------------------------- the block alone

def _moe_cfg(shared=0, norm=True, experts=EXPERTS, top_k=TOP_K):
    return MoeConfig(num_experts=experts, top_k=top_k, expert_intermediate=16, norm_topk_prob=norm,
                     shared_intermediate=shared, sparse_layers=(True,))


def _block_params(m: MoeConfig, key, h=HIDDEN):
    ks = jax.random.split(key, 8)
    n = lambda k, shape, s: s * jax.random.normal(k, shape, jnp.float32)
    e, ie = m.num_experts, m.expert_intermediate
    p = {"router": n(ks[0], (h, e), 3 / h**0.5), "experts_gate": n(ks[1], (e, h, ie), h**-0.5),
         "experts_up": n(ks[2], (e, h, ie), h**-0.5), "experts_down": n(ks[3], (e, ie, h), ie**-0.5)}
    if m.shared_intermediate:
        s = m.shared_intermediate
        p.update(shared_gate=n(ks[4], (h, s), h**-0.5), shared_up=n(ks[5], (h, s), h**-0.5),
                 shared_down=n(ks[6], (s, h), s**-0.5), shared_expert_gate=n(ks[7], (h, 1), h**-0.5))
    return p


def _reference_block(p: dict, x: np.ndarray, m: MoeConfig) -> np.ndarray:
    """The MoE block as transformers writes it, in float64 NumPy: a loop over experts, no ragged_dot."""
    p = {k: np.asarray(v, np.float64) for k, v in p.items()}
    x2 = x.reshape(-1, x.shape[-1]).astype(np.float64)
    logits = x2 @ p["router"]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    idx = np.argsort(-probs, axis=-1, kind="stable")[:, :m.top_k]
    w = np.take_along_axis(probs, idx, -1)
    if m.norm_topk_prob:
        w /= w.sum(-1, keepdims=True)
    silu = lambda z: z / (1 + np.exp(-z))
    out = np.zeros_like(x2)
    for e in range(m.num_experts):
        tok, slot = np.nonzero(idx == e)
        y = silu(x2[tok] @ p["experts_gate"][e]) * (x2[tok] @ p["experts_up"][e])
        np.add.at(out, tok, (y @ p["experts_down"][e]) * w[tok, slot][:, None])
    if m.shared_intermediate:
        gate = 1 / (1 + np.exp(-(x2 @ p["shared_expert_gate"])))
        out += gate * ((silu(x2 @ p["shared_gate"]) * (x2 @ p["shared_up"])) @ p["shared_down"])
    return out.reshape(x.shape)


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (2, 9), (1, 40)])
@pytest.mark.parametrize("shared,norm", [(0, True), (24, False)])
def test_ragged_block_matches_a_loop_over_experts(shape, shared, norm, monkeypatch):
    """Decode (T = 1), batch rows, a verify's rows, a prefill chunk; unfused and fused layouts;
    the grouped ragged_dot and the GPUs' alternatives (dense, in chunks too; gather; the grouped
    Pallas product, interpreted)."""
    m = _moe_cfg(shared, norm)
    p = _block_params(m, jax.random.PRNGKey(shape[1] + shared))
    x = np.random.default_rng(sum(shape)).standard_normal((*shape, HIDDEN)).astype(np.float32)
    ref = _reference_block(p, x, m)
    fused = tmodel.fuse_params({"embed": None, "norm": None, "layers": [p]}, stack=False)["layers"][0]
    assert "experts_gate_up" in fused and ("shared_gate_up" in fused) == bool(shared)
    monkeypatch.setattr(moe, "DENSE_CHUNK", 16)     # 40 tokens: three chunks, the last padded
    for impl, gather_max in (("ragged", 0), ("dense", 0), ("ragged", 64), ("grouped", 0)):
        kernels = dataclasses.replace(CPU_KERNELS, moe_experts=impl, moe_gather_max=gather_max,
                                      matmul="pallas_interpret" if impl == "grouped" else "auto")
        for layout in ((p, fused) if impl != "grouped" else (fused,)):   # the grouped kernel reads the fused experts
            got = jax.jit(lambda q, v: moe.block(q, v, m, kernels=kernels))(layout, jnp.asarray(x))
            np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-5, err_msg=f"{impl} {gather_max}")


def test_gpu_tuning_picks_the_experts_impl_by_tokens():
    from ddtree_jax.kernels import dispatch
    from ddtree_jax.tuning import GPU_KERNELS, HOPPER_KERNELS

    assert dispatch.moe_choice(CPU_KERNELS, 1) == "dense" and dispatch.moe_choice(CPU_KERNELS, 65) == "dense"
    for k in (GPU_KERNELS, HOPPER_KERNELS):
        assert dispatch.moe_choice(k, 1) == "grouped" and dispatch.moe_choice(k, 33) == "grouped"
    assert dispatch.moe_choice(dataclasses.replace(CPU_KERNELS, moe_gather_max=4), 4) == "gather"
    with pytest.raises(ValueError, match="moe_experts"):
        dataclasses.replace(CPU_KERNELS, moe_experts="sparse")


def test_rows_routed_to_one_expert():
    """Every row of a batch routed to the same experts (one big group, the rest empty), and a
    token's output independent of the pass it is in (alone, or among others)."""
    m = _moe_cfg(norm=False)
    p = _block_params(m, jax.random.PRNGKey(3))
    p["router"] = p["router"].at[0, 5].set(50.0).at[0, 2].set(40.0)        # feature 0 large: experts 5 then 2
    x = np.random.default_rng(4).standard_normal((4, 3, HIDDEN)).astype(np.float32) * 0.1
    x[..., 0] = 3.0
    _, idx = moe.route(p, jnp.asarray(x.reshape(-1, HIDDEN)), m)
    assert (np.asarray(idx) == [5, 2]).all()
    got = np.asarray(moe.block(p, jnp.asarray(x), m))
    np.testing.assert_allclose(got, _reference_block(p, x, m), rtol=1e-5, atol=1e-5)
    alone = np.asarray(moe.block(p, jnp.asarray(x[1:2, 2:3]), m))
    np.testing.assert_allclose(alone[0, 0], got[1, 2], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("a, e, tile", [(8, 128, 16), (130, 8, 16), (520, 128, 16), (3, 4, 2), (64, 2, 16)])
def test_group_rows_layout(a, e, tile, monkeypatch):
    """matmul.group_rows, by comparisons (few rows) and by a sort (many): the same layout, and the
    layout asked for: each expert's rows in their own whole tiles, in row order, every tile
    labelled with its expert (-1 past the last)."""
    from ddtree_jax.kernels import matmul as mm

    experts = jnp.asarray(np.random.default_rng(a + e).integers(0, e, a), jnp.int32)
    assert a * max(a, e) <= mm.GROUP_BY_COMPARISON
    dest, groups = (np.asarray(x) for x in jax.jit(mm.group_rows, static_argnums=(1, 2))(experts, e, tile))
    monkeypatch.setattr(mm, "GROUP_BY_COMPARISON", 0)
    dest_sorted, groups_sorted = (np.asarray(x) for x in jax.jit(mm.group_rows, static_argnums=(1, 2))(experts, e, tile))
    np.testing.assert_array_equal(dest, dest_sorted)
    np.testing.assert_array_equal(groups, groups_sorted)
    ex = np.asarray(experts)
    assert len(set(dest.tolist())) == a and groups.shape == (-(-a // tile) + min(a, e),)
    row = 0
    for x in range(e):
        mine = np.flatnonzero(ex == x)
        if not len(mine):
            continue
        np.testing.assert_array_equal(dest[mine], row + np.arange(len(mine)))  # together, in row order
        n_tiles = -(-len(mine) // tile)
        assert row % tile == 0 and (groups[row // tile: row // tile + n_tiles] == x).all()
        row += n_tiles * tile
    assert (groups[row // tile:] == -1).all()


def test_distinct_expert_counts():
    """Tokens that are basis vectors and a router that sends token t to its two chosen experts:
    the counts per expert and the number of distinct experts a pass read, from the block and from
    the forward (a dense layer's row zeros)."""
    h, e = 8, 6
    m = _moe_cfg(experts=e)
    choice = [(0, 1), (1, 2), (2, 0), (4, 1)]
    router = np.zeros((h, e), np.float32)
    for t, (a, b) in enumerate(choice):
        router[t, a], router[t, b] = 10.0, 9.0
    p = _block_params(m, jax.random.PRNGKey(5), h=h)
    p["router"] = jnp.asarray(router)
    x = jnp.asarray(np.eye(h, dtype=np.float32)[:4].reshape(2, 2, h))
    _, counts = moe.block(p, x, m, counts=True)
    assert np.asarray(counts).tolist() == [2, 3, 2, 0, 1, 0]
    assert int(moe.distinct_experts(counts)) == 4

    cfg = _tiny_moe_cfg(shared=0)
    params = init_target(cfg, jax.random.PRNGKey(0), jit=True)
    tokens = jnp.asarray([[3, 9, 27, 11, 40]], jnp.int32)
    pos = jnp.arange(5, dtype=jnp.int32)[None]
    out = forward(params, cfg, tokens, pos, None, None, tmodel.causal_mask(1, 5), moe_stats=True)
    counts = np.asarray(out[3])
    assert counts.shape == (cfg.num_layers, cfg.moe.num_experts)
    assert (counts[0] == 0).all() and (counts[1:].sum(-1) == 5 * cfg.moe.top_k).all()
    assert (np.asarray(moe.distinct_experts(out[3]))[1:] >= cfg.moe.top_k).all()
    plain = forward(params, cfg, tokens, pos, None, None, tmodel.causal_mask(1, 5))
    assert len(plain) == 3
    np.testing.assert_array_equal(np.asarray(plain[0]), np.asarray(out[0]))
    with pytest.raises(ValueError, match="no mixture-of-experts"):
        dense = TargetConfig(**{**cfg.__dict__, "moe": None})
        tmodel.forward(params, dense, tokens, pos, None, None, tmodel.causal_mask(1, 5), moe_stats=True)


# --------------------------------------------------------------------------- engine and kernels

def _tiny_moe_cfg(shared=24, layers=3):
    m = MoeConfig(num_experts=EXPERTS, top_k=TOP_K, expert_intermediate=16, norm_topk_prob=True,
                  shared_intermediate=shared, sparse_layers=(False,) + (True,) * (layers - 1))
    return TargetConfig(family="qwen2_moe" if shared else "qwen3_moe", vocab_size=64, hidden_size=HIDDEN,
                        intermediate_size=64, num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-6,
                        max_position=4096, tie_embeddings=False, qk_norm=not shared, qkv_bias=bool(shared), moe=m)


def test_init_target_shapes_and_fused_experts():
    cfg = _tiny_moe_cfg()
    a = init_target(cfg, jax.random.PRNGKey(0))
    b = init_target(cfg, jax.random.PRNGKey(0), fused_experts=True, jit=True)
    assert "gate_up" not in tmodel.fuse_params(a)["layers"][1] and "down" not in a["layers"][1]
    assert a["layers"][1]["experts_gate"].shape == (EXPERTS, HIDDEN, 16)
    assert a["layers"][1]["experts_down"].shape == (EXPERTS, 16, HIDDEN)
    assert a["layers"][1]["shared_expert_gate"].shape == (HIDDEN, 1) and "gate" in a["layers"][0]
    assert _count(a) == cfg.num_params
    fa, fb = tmodel.fuse_params(a), tmodel.fuse_params(b)
    assert jax.tree_util.tree_structure(fa) == jax.tree_util.tree_structure(fb)
    assert all(x.shape == y.shape for x, y in zip(jax.tree_util.tree_leaves(fa), jax.tree_util.tree_leaves(fb)))
    assert fb["layers"][1]["experts_gate_up"] is b["layers"][1]["experts_gate_up"]    # fusing copied nothing


def test_fused_gpu_layers_with_moe_match_the_xla_forward():
    """With every dense projection in the skinny-matmul kernel (interpreted), an MoE target runs
    _forward_fused: fused attention in every layer, the dense layer fused, the MoE layers' block
    after the norm kernel; in float32 it matches the XLA forward (hidden, taps, K/V, counts)."""
    cfg = _tiny_moe_cfg(shared=24)
    tp = tmodel.fuse_params(init_target(cfg, jax.random.PRNGKey(1)))
    rng = np.random.default_rng(0)
    shape = (2, cfg.num_kv_heads, 32, cfg.head_dim)
    cache = KVCache.from_layers([jnp.asarray(rng.standard_normal(shape), jnp.float32)] * cfg.num_layers,
                                [jnp.asarray(rng.standard_normal(shape), jnp.float32)] * cfg.num_layers)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
    length = jnp.asarray([5, 11], jnp.int32)
    pos = length[:, None] + jnp.arange(9, dtype=jnp.int32)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((9, 9), bool)), (2, 9, 9))
    kernel, xla = (CPU_KERNELS.with_impls(matmul=impl) for impl in ("pallas_interpret", "xla"))
    assert tmodel._fused_layers(tp, cfg, (2, 9, cfg.hidden_size), kernel)
    outs = [tmodel.forward(tp, cfg, tokens, pos, cache, length, mask, taps=(0, 2), kernels=k, moe_stats=True)
            for k in (xla, kernel)]
    np.testing.assert_array_equal(np.asarray(outs[0][3]), np.asarray(outs[1][3]))
    for a, b in zip(jax.tree_util.tree_leaves(outs[0][:3]), jax.tree_util.tree_leaves(outs[1][:3])):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-5)


def test_speculative_rounds_with_an_moe_target_are_lossless():
    """Greedy DDTree (budgets 8 and 32) and DFlash with a random drafter tapping the MoE target,
    and DDTree with a noisy oracle (deep acceptance through side branches): AR's tokens, float32."""
    from tiny import oracle_extra, oracle_params

    cfg = _tiny_moe_cfg(shared=24)
    tp = init_target(cfg, jax.random.PRNGKey(2))
    tp["lm_head"] = tp["lm_head"] * 4.0      # sharper logits: fewer near-ties
    ns = _namespace(cfg, tp)
    prompts = [[3, 14, 15, 9, 26], [5, 35, 8, 9, 7, 9, 32, 3]]
    # one AR run serves as the reference and the oracle's continuation (one executable fewer to compile)
    greedy = [r.token_ids for r in Generator(ns, method="ar").generate_ids(prompts,
                                                                          max_new_tokens=24 + oracle_extra(ns))]
    ar = [g[:24] for g in greedy]
    for method, budget in (("dflash", 1), ("ddtree", 8), ("ddtree", 32)):
        got = Generator(ns, method=method, budget=budget).generate_ids(prompts, max_new_tokens=24)
        assert [r.token_ids for r in got] == ar, (method, budget)
    oracle = oracle_params(ns, prompts, 24, noise=1.5, greedy=greedy)
    oracle["strength"] = jnp.float32(4.0)    # deep enough paths in a tree of 32 under that noise
    # and with the GPUs' experts impls (decode steps gather, verify passes dense)
    gpu_moe = Tuning(kernels=dataclasses.replace(CPU_KERNELS, moe_experts="dense", moe_gather_max=4))
    for tuning in (None, gpu_moe):
        got = Generator(ns, method="ddtree", budget=32, oracle=oracle, tuning=tuning).generate_ids(prompts,
                                                                                                   max_new_tokens=24)
        assert [r.token_ids for r in got] == ar
        assert max(a for r in got for a in r.acceptance_lengths) > 2
    got = Generator(ns, method="ar", tuning=gpu_moe).generate_ids(prompts, max_new_tokens=24)
    assert [r.token_ids for r in got] == ar
