"""The qwen3_5 hybrid target (ddtree_jax.models.hybrid) against transformers' Qwen3_5ForCausalLM.

A tiny float32 model (3 GDN layers and 1 gated full-attention layer, partial rotary, weights drawn
so the 1 + w norms, decays and gates all matter) is mapped into our layout: a right-padded batch
prefill, decode steps after it, a branching tree verify (every node vs. the model on prefix + its
root path) and the commit of an accepted path (then decode) all match transformers.
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
from ddtree_jax.models import hybrid  # noqa: E402
from ddtree_jax.tuning import GDN_TREE_FORMS, XLA_KERNELS  # noqa: E402

VOCAB, HIDDEN, MAX_LEN = 128, 64, 48
TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
REL = 1e-5

prefill = jax.jit(hybrid.prefill, static_argnames=("cfg", "taps", "kernels"))
decode = jax.jit(hybrid.decode, static_argnames=("cfg", "taps", "kernels"))
verify_tree = jax.jit(hybrid.verify_tree, static_argnames=("cfg", "taps", "kernels"))
commit = jax.jit(hybrid.commit, static_argnames=("cfg", "kernels"))


def _hf_config(**over):
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig

    kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6, layer_types=TYPES, linear_num_key_heads=2,
              linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_conv_kernel_dim=4,
              tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                          "partial_rotary_factor": 0.25})
    kw.update(over)
    return Qwen3_5TextConfig(**kw)


@pytest.fixture(scope="module")
def model():
    """(transformers model, our HybridConfig, our params)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    return _build(Qwen3_5ForCausalLM, _hf_config())


def _build(cls, hf_cfg):
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    mod = cls(hf_cfg).float().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, w in mod.named_parameters():
            if name.endswith("A_log"):  # decays 0.02..0.8: some heads remember the whole prompt
                w.copy_(torch.log(0.02 + 0.78 * torch.rand(w.shape, generator=gen)))
            elif name.endswith("dt_bias"):
                w.copy_(0.5 * torch.randn(w.shape, generator=gen))
            elif name.endswith("linear_attn.norm.weight"):  # the gated norm: no 1 + w
                w.copy_(1.0 + 0.1 * torch.randn(w.shape, generator=gen))
            elif name.endswith("conv1d.weight"):
                w.copy_(0.6 * torch.randn(w.shape, generator=gen))
            elif w.ndim == 1:  # the 1 + w norms: w far from 0, so a missing offset shows
                w.copy_(0.3 * torch.randn(w.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                w.copy_(torch.randn(w.shape, generator=gen))
            else:  # projections: unit gain over the fan-in (the LM head a little more: decisive logits)
                gain = 3.0 if name == "lm_head.weight" else 1.0
                w.copy_(gain * torch.randn(w.shape, generator=gen) / w.shape[-1] ** 0.5)
    cfg = hybrid.HybridConfig.from_hf(hf_cfg.to_dict())
    weights = {k: v.detach().numpy() for k, v in mod.state_dict().items()}
    params = jax.tree.map(jnp.asarray, hybrid.params_from_hf(weights, cfg))
    return mod, cfg, params


def _close(got, want, rel: float = REL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"


def _hf_logits(mod, ids) -> np.ndarray:
    """transformers' logits [T, V] for one unpadded sequence, no cache."""
    with torch.no_grad():
        return mod(torch.tensor([list(ids)]), use_cache=False).logits[0].numpy()


def _tokens(seed: int, *shape) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


def _state(cfg, batch: int):
    return hybrid.HybridState.zeros(cfg, batch, MAX_LEN, jnp.float32)


def test_config_and_layout(model):
    _, cfg, params = model
    assert cfg.attn_layers == (1,) and cfg.gdn_layers == (0, 2, 3) and cfg.rotary_dim == 8
    assert params["layers"][1]["q"].shape == params["layers"][1]["q_gate"].shape == (HIDDEN, 4 * 32)
    d = _hf_config().to_dict()
    # a multimodal config nests the text model; its top level decides tying
    top = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": d,
           "tie_word_embeddings": True}
    nested = hybrid.HybridConfig.from_hf(top)
    assert nested.tie_embeddings and dataclasses.replace(nested, tie_embeddings=False) == cfg
    for bad in ({**d, "layer_types": ["linear_attention"] * 3}, {**d, "layer_types": ["sliding_attention"] * 4},
                {**d, "num_experts": 8}, {**d, "architectures": ["Qwen3ForCausalLM"]},
                {**d, "rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.01}}):
        with pytest.raises(ConfigError) as e:
            hybrid.HybridConfig.from_hf(bad)
        assert "\n" not in str(e.value)
    # model.language_model. names (a multimodal checkpoint) map the same; visual weights ignored
    weights = {k.replace("model.", "model.language_model.", 1): v for k, v in _flat_hf(model[0]).items()}
    weights["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((3, 3), np.float32)
    again = hybrid.params_from_hf(weights, cfg)
    assert jax.tree.all(jax.tree.map(lambda a, b: np.array_equal(a, b), again, jax.tree.map(np.asarray, params)))
    name = "model.language_model.layers.1.self_attn.q_proj.weight"
    for broken in ({k: v for k, v in weights.items() if k != name}, {**weights, name: weights[name][:-1]}):
        with pytest.raises(ConfigError, match="q_proj") as e:
            hybrid.params_from_hf(broken, cfg)
        assert "\n" not in str(e.value)


def _flat_hf(mod) -> dict:
    return {k: v.detach().numpy() for k, v in mod.state_dict().items()}


def test_prefill_then_decode_match_transformers(model):
    from transformers.cache_utils import DynamicCache

    mod, cfg, params = model
    lengths = np.array([14, 9], np.int32)
    tokens = _tokens(0, 2, 14)
    logits, _, state = prefill(params, cfg, jnp.asarray(tokens), _state(cfg, 2), jnp.asarray(lengths))
    assert np.asarray(state.lengths).tolist() == lengths.tolist()
    nxt = _tokens(1, 2, 4)
    caches = []
    for b, n in enumerate(lengths):
        cache = DynamicCache(config=mod.config)
        with torch.no_grad():
            want = mod(torch.tensor(tokens[b:b + 1, :n]), cache=cache, use_cache=True).logits[0].numpy()
        _close(logits[b, :n], want)
        caches.append(cache)
    for t in range(nxt.shape[1]):
        step_logits, _, state = decode(params, cfg, jnp.asarray(nxt[:, t]), state)
        for b in range(2):
            with torch.no_grad():
                want = mod(torch.tensor(nxt[b:b + 1, t:t + 1]), cache=caches[b], use_cache=True).logits[0, 0].numpy()
            _close(step_logits[b], want)
    assert np.asarray(state.lengths).tolist() == (lengths + nxt.shape[1]).tolist()


# a branching tree: root 0; depths 0 1 2 1 2 3 2 3
PARENTS = np.array([-1, 0, 1, 0, 3, 4, 1, 2], np.int32)


def _depths_and_mask(parents: np.ndarray):
    n = len(parents)
    mask = np.eye(n, dtype=bool)
    depths = np.zeros(n, np.int32)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
        depths[i] = depths[parents[i]] + 1
    return depths, mask


def _root_path(parents: np.ndarray, i: int) -> list[int]:
    path = [i]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("gdn_tree", GDN_TREE_FORMS)
def test_verify_tree_and_commit_match_transformers(model, gdn_tree):
    """Either form of the GDN layers' tree verify (the parallel form, or node by node through the
    recurrence kernel, interpreted here) and its commit."""
    mod, cfg, params = model
    kernels = dataclasses.replace(XLA_KERNELS, gdn_tree=gdn_tree)
    lengths = np.array([11, 7], np.int32)
    prompt = _tokens(2, 2, 14)  # the prefill test's shape: one compilation
    _, _, state = prefill(params, cfg, jnp.asarray(prompt), _state(cfg, 2), jnp.asarray(lengths))
    n = len(PARENTS)
    depths, mask = _depths_and_mask(PARENTS)
    nodes = _tokens(3, 2, n)
    bt = lambda a: jnp.asarray(np.broadcast_to(a, (2, *a.shape)))  # noqa: E731
    pre = state
    logits, _, out = verify_tree(params, cfg, jnp.asarray(nodes), bt(PARENTS), bt(mask), bt(depths), state,
                                 kernels=kernels)
    leaves = [i for i in range(n) if i not in PARENTS]
    for b in range(2):
        prefix = list(prompt[b, :lengths[b]])
        for leaf in leaves:  # one transformers pass a leaf covers every node on its root path
            path = _root_path(PARENTS, leaf)
            want = _hf_logits(mod, prefix + list(nodes[b, path]))[len(prefix):]
            for d, i in enumerate(path):
                _close(logits[b, i], want[d])

    # accept root -> 3 -> 4 -> 5 in row 0 (depth 3), root -> 1 in row 1; then decode two tokens
    paths = [[0, 3, 4, 5], [0, 1]]
    path = np.zeros((2, 4), np.int32)
    for b, p in enumerate(paths):
        path[b, :len(p)] = p
    path_len = np.array([len(p) for p in paths], np.int32)
    # an inactive row keeps its state: the GDN states have no positions to hide new ones behind
    held = commit(cfg, state, out, jnp.asarray(path), jnp.asarray(path_len), jnp.asarray([True, False]),
                  kernels=kernels)
    state = commit(cfg, state, out, jnp.asarray(path), jnp.asarray(path_len), kernels=kernels)
    assert int(held.lengths[1]) == lengths[1] and int(held.lengths[0]) == int(state.lengths[0])
    for name in ("conv", "rec"):
        before, kept, moved = (np.asarray(getattr(s, name)) for s in (pre, held, state))
        assert np.array_equal(kept[:, 1], before[:, 1]) and np.array_equal(kept[:, 0], moved[:, 0])
    assert np.asarray(state.lengths).tolist() == (lengths + path_len).tolist()
    nxt = _tokens(4, 2, 2)
    want = [_hf_logits(mod, list(prompt[b, :lengths[b]]) + list(nodes[b, p]) + list(nxt[b]))[-2:]
            for b, p in enumerate(paths)]
    for t in range(2):
        step_logits, _, state = decode(params, cfg, jnp.asarray(nxt[:, t]), state)
        for b in range(2):
            _close(step_logits[b], want[b][t])


def test_prefill_in_pieces_and_forward_train(model):
    mod, cfg, params = model
    tokens = _tokens(5, 2, 14)
    # a padded first piece, then a second one over the state (the engine's chunked prompt)
    first, second = np.array([6, 4], np.int32), np.array([8, 5], np.int32)
    _, _, state = prefill(params, cfg, jnp.asarray(tokens[:, :6]), _state(cfg, 2), jnp.asarray(first))
    rest = np.stack([tokens[b, n:n + 8] for b, n in enumerate(first)])
    logits, _, state = prefill(params, cfg, jnp.asarray(rest), state, jnp.asarray(second))
    for b in range(2):
        want = _hf_logits(mod, list(tokens[b, :first[b]]) + list(rest[b, :second[b]]))[first[b]:]
        _close(logits[b, :second[b]], want)

    # the cache-free pass, its taps HF's hidden_states[i + 1] (the last one final-normed)
    taps = (0, 1, 3)
    logits, tapped = jax.jit(hybrid.forward_train, static_argnames=("cfg", "taps"))(
        params, cfg, jnp.asarray(tokens), taps=taps)
    with torch.no_grad():
        out = mod(torch.tensor(tokens), use_cache=False, output_hidden_states=True)
    _close(logits, out.logits.numpy())
    want = np.concatenate([out.hidden_states[i + 1].numpy() for i in taps], axis=-1)
    _close(tapped, want)


def test_tied_embeddings():
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    mod, cfg, params = _build(Qwen3_5ForCausalLM, _hf_config(tie_word_embeddings=True))
    assert cfg.tie_embeddings and "lm_head" not in params
    tokens = _tokens(6, 1, 10)
    logits, _ = jax.jit(hybrid.forward_train, static_argnames=("cfg", "taps"))(params, cfg, jnp.asarray(tokens))
    _close(logits[0], _hf_logits(mod, tokens[0]))


def test_inference_layout_fuses_each_layers_products(model):
    _, cfg, params = model
    hq, dh = cfg.num_heads, cfg.head_dim

    def as_stored(p):  # checkpoint/names.py's layout: q_proj per head [query | gate] as "qg"
        if "q" not in p:
            return p
        p = dict(p)
        heads = [p.pop(n).reshape(HIDDEN, hq, 1, dh) for n in ("q", "q_gate")]
        return {**p, "qg": jnp.concatenate(heads, axis=2).reshape(HIDDEN, hq * 2 * dh)}

    stored = {**params, "layers": [as_stored(p) for p in params["layers"]]}
    fused = {**params, "layers": [hybrid.fuse_layer(p) for p in stored["layers"]]}
    gdn_layer, attn_layer = fused["layers"][0], fused["layers"][1]
    assert {"gate_up", "qgkv"} <= set(attn_layer) and not {"gate", "up", "qg", "k", "v"} & set(attn_layer)
    assert set(gdn_layer["linear"]) >= {"in_proj"} and not {"qkv", "z", "b", "a"} & set(gdn_layer["linear"])
    # params_from_hf's layout (q and q_gate apart) keeps its attention products apart
    assert {"q", "q_gate", "k", "v", "gate_up"} <= set(hybrid.fuse_layer(params["layers"][1]))

    tokens, lengths = jnp.asarray(_tokens(7, 2, 14)), jnp.asarray([14, 9], jnp.int32)
    depths, mask = _depths_and_mask(PARENTS)
    bt = lambda a: jnp.asarray(np.broadcast_to(a, (2, *a.shape)))  # noqa: E731
    nodes = jnp.asarray(_tokens(8, 2, len(PARENTS)))
    got = []
    for p in (params, stored, fused):
        logits, _, state = prefill(p, cfg, tokens, _state(cfg, 2), lengths)
        tree_logits, _, _ = verify_tree(p, cfg, nodes, bt(PARENTS), bt(mask), bt(depths), state)
        got.append((logits, tree_logits, state.rec))
    for other in got[1:]:
        for a, b in zip(got[0], other):
            _close(b, a)
