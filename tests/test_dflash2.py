"""The DFlash 2 drafter (drafters/dflash2.py): its config, its conversion names, parity with an
independent torch implementation of the public math (z-lab's DFlash2DraftModel, vLLM's
qwen3_dflash2 / DFlash2Speculator), and greedy DFlash / DDTree rounds equal to plain decoding.

A tiny DFlash 2 checkpoint is a tiny DFlash one (hf_fixtures.make_drafter) plus the tensors and
config keys DFlash 2 adds, named and shaped as z-lab's published Qwen3.8-27B-DFlash2 header.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from ddtree_jax.checkpoint import load_checkpoint, load_hf
from ddtree_jax.checkpoint import names
from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.drafters import dflash2
from ddtree_jax.errors import ConfigError, UserError
from ddtree_jax.generator import Executables, Generator
from ddtree_jax.models.config import DrafterConfig
from ddtree_jax.models.layers import KVCache
from hf_fixtures import make_drafter, make_target

# ----------------------------------------------------------------------------- a tiny DFlash 2 checkpoint


def make_dflash2(dir: Path, target: Path, *, layers: int = 2, taps: int = 2, group: int = 16, rank: int = 8,
                 top_k: int = 16, block_size: int = 8, target_layer_ids=(1, 2), seed: int = 0,
                 config_edits: dict | None = None, dflash_edits: dict | None = None, **drafter_kw) -> Path:
    """A z-lab format DFlash 2 drafter for `target` in `dir`: make_drafter's DFlash one, its
    architecture DFlash2DraftModel, `is_causal` false, the four DFlash 2 keys in dflash_config,
    and per layer attention_conv / mlp_conv (base_kernel [2, taps, H], kernel_projection.weight
    [2 taps G, H]) and candidate_selector's hidden_projection.weight [R, H] and codebooks [V, R].
    Scales: tap 0's base near 1, the others' and the dynamic part O(0.3); codebooks whose edge
    scores have a std of ~2 (the head's logits have ~3), so the selector reorders candidates."""
    dir = make_drafter(dir, target, layers=layers, block_size=block_size, target_layer_ids=list(target_layer_ids),
                       seed=seed, **drafter_kw)
    cfg = json.loads((dir / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    g = h // group
    gen = torch.Generator().manual_seed(seed + 100)

    def randn(*shape):
        return torch.randn(shape, generator=gen)

    sd = load_file(str(dir / "model.safetensors"))
    for i in range(layers):
        for name in ("attention_conv", "mlp_conv"):
            base = 0.4 * randn(2, taps, h)
            base[:, 0] += 1.0
            sd[f"layers.{i}.{name}.base_kernel"] = base
            sd[f"layers.{i}.{name}.kernel_projection.weight"] = 0.3 * randn(2 * taps * g, h) / math.sqrt(h)
    code = math.sqrt(2.0 / math.sqrt(rank))
    sd["candidate_selector.hidden_projection.weight"] = randn(rank, h) / math.sqrt(h)
    sd["candidate_selector.predecessor_codebook"] = code * randn(v, rank)
    sd["candidate_selector.successor_codebook"] = code * randn(v, rank)
    save_file({k: t.contiguous() for k, t in sd.items()}, str(dir / "model.safetensors"), metadata={"format": "pt"})
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["is_causal"] = False
    cfg["dflash_config"].update(conv_kernel_size=taps, conv_group_size=group, selector_rank=rank,
                                selector_top_k=top_k, block_size=block_size, **(dflash_edits or {}))
    cfg.update(config_edits or {})
    cfg = {k: x for k, x in cfg.items() if x is not _DROP}
    (dir / "config.json").write_text(json.dumps(cfg, indent=2))
    return dir


_DROP = object()  # a config_edits value: leave the key out


@pytest.fixture(scope="module")
def hf_target(tmp_path_factory) -> Path:
    return make_target(tmp_path_factory.mktemp("d2_target") / "hf", "qwen3", vocab=384)


@pytest.fixture(scope="module")
def hf_draft(tmp_path_factory, hf_target) -> Path:
    return make_dflash2(tmp_path_factory.mktemp("d2_draft") / "hf", hf_target)


@pytest.fixture(scope="module")
def converted(tmp_path_factory, hf_target, hf_draft) -> Path:
    from convert import main

    out = tmp_path_factory.mktemp("d2_conv") / "ck"
    assert main(["--target", str(hf_target), "--draft", str(hf_draft), "--out", str(out), "--dtype", "float32"]) == 0
    return out


# ----------------------------------------------------------------------------- config


QWEN38_DRAFT = {  # z-lab/Qwen3.8-27B-DFlash2's config.json, as its public ports record it
    "architectures": ["DFlash2DraftModel"], "attention_bias": False, "is_causal": False, "hidden_act": "silu",
    "dflash_config": {"block_size": 8, "conv_group_size": 16, "conv_kernel_size": 2, "mask_token_id": 248070,
                      "selector_rank": 256, "selector_top_k": 16, "target_layer_ids": [5, 19, 33, 47, 61]},
    "head_dim": 128, "hidden_size": 5120, "intermediate_size": 17408, "layer_types": ["sliding_attention"] * 5,
    "num_attention_heads": 32, "num_hidden_layers": 5, "num_key_value_heads": 8, "num_target_layers": 64,
    "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"},
    "sliding_window": 2048, "vocab_size": 248320,
}


def _edit(d: dict, **dfc) -> dict:
    d = json.loads(json.dumps(d))
    for k, v in dfc.items():
        if v is _DROP:
            d["dflash_config"].pop(k, None)
        else:
            d["dflash_config"][k] = v
    return d


def test_the_published_config_parses_and_names_the_published_tensors():
    cfg = dflash2.drafter_config_from_hf(QWEN38_DRAFT)
    assert isinstance(cfg, dflash2.DFlash2Config) and isinstance(cfg, DrafterConfig)
    assert (cfg.block_size, cfg.depth, cfg.conv_kernel_size, cfg.conv_group_size, cfg.conv_groups) == (8, 7, 2, 16, 320)
    assert (cfg.selector_rank, cfg.selector_top_k, cfg.causal) == (256, 16, (False,) * 5)
    assert (cfg.input_embedding_scale, cfg.output_multiplier, cfg.final_logit_softcapping) == (1.0, 1.0, None)
    hf = {n: s for e in names.entries_for(cfg) for n, s in e.hf_tensors.items()}
    assert len(hf) == 81  # the published header: DFlash's 61 and these 20
    assert hf["layers.4.attention_conv.base_kernel"] == (2, 2, 5120)
    assert hf["layers.0.mlp_conv.kernel_projection.weight"] == (1280, 5120)
    assert hf["candidate_selector.hidden_projection.weight"] == (256, 5120)
    assert hf["candidate_selector.predecessor_codebook"] == hf["candidate_selector.successor_codebook"] == (248320, 256)
    assert hash(cfg) == hash(dflash2.drafter_config_from_hf(QWEN38_DRAFT))  # a static jit argument


def test_optional_keys_and_the_causal_rule():
    cfg = dflash2.drafter_config_from_hf(_edit(QWEN38_DRAFT, output_multiplier=0.25, final_logit_softcapping=20.0,
                                               input_embedding_scale=2.0))
    assert (cfg.output_multiplier, cfg.final_logit_softcapping, cfg.input_embedding_scale) == (0.25, 20.0, 2.0)
    uncapped = dflash2.drafter_config_from_hf(_edit(QWEN38_DRAFT, final_logit_softcapping=0.0))
    assert uncapped.final_logit_softcapping is None
    no_flag = {k: v for k, v in QWEN38_DRAFT.items() if k != "is_causal"}
    mixed = {**no_flag, "layer_types": ["sliding_attention", "full_attention"] * 2 + ["full_attention"]}
    assert dflash2.drafter_config_from_hf(mixed).causal == (True, False, True, False, False)  # sliding layers
    assert dflash2.drafter_config_from_hf(_edit(mixed, causal=False)).causal == (False,) * 5
    assert dflash2.drafter_config_from_hf({**mixed, "is_causal": True}).causal == (True,) * 5
    # DFlash configs stay DFlash's; a DFlash 2 key makes a config DFlash 2's whatever it is called
    dflash_cfg = {**QWEN38_DRAFT, "architectures": ["DFlashDraftModel"],
                  "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [5, 19, 33, 47, 61]}}
    assert type(dflash2.drafter_config_from_hf(dflash_cfg)) is DrafterConfig
    assert dflash2.is_dflash2({**QWEN38_DRAFT, "architectures": ["DFlashDraftModel"]})


@pytest.mark.parametrize("edit,match", [
    (dict(conv_kernel_size=_DROP), "dflash_config lacks 'conv_kernel_size'; a DFlash 2 drafter"),
    (dict(conv_group_size=_DROP), "dflash_config lacks 'conv_group_size'"),
    (dict(selector_rank=_DROP), "dflash_config lacks 'selector_rank'"),
    (dict(selector_top_k=_DROP, selector_rank=None), "lacks 'selector_rank', 'selector_top_k'"),
    (dict(conv_group_size=48), "conv_group_size 48 does not divide hidden_size 5120"),
    (dict(selector_top_k=300000), "selector_top_k 300000 is more than vocab_size 248320"),
    (dict(conv_kernel_size=0), "dflash_config.conv_kernel_size is 0; it must be an integer >= 1"),
    (dict(selector_rank="256"), "dflash_config.selector_rank is \"256\""),
    (dict(output_multiplier=-1.0), "dflash_config.output_multiplier is -1.0"),
    (dict(final_logit_softcapping="20"), "final_logit_softcapping is \"20\""),
    (dict(causal="no"), "dflash_config.causal is \"no\"; it must be true, false or null"),
])
def test_bad_configs_are_one_line_naming_the_field(edit, match):
    d = _edit(QWEN38_DRAFT, **edit)
    if "causal" in edit:
        d.pop("is_causal")
    with pytest.raises(ConfigError, match=match) as e:
        dflash2.drafter_config_from_hf(d, where="draft/config.json")
    assert "\n" not in str(e.value)


def test_a_dflash2_config_without_dflash_config():
    d = {k: v for k, v in QWEN38_DRAFT.items() if k != "dflash_config"}
    with pytest.raises(ConfigError, match="lacks the field 'dflash_config'; a DFlash 2 drafter"):
        dflash2.drafter_config_from_hf(d)


def test_convert_refuses_a_dflash2_config_missing_a_key(tmp_path, hf_target, hf_draft, capsys):
    """Through the convert CLI: one line, exit 2, nothing written."""
    from convert import main

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "model.safetensors").symlink_to(hf_draft / "model.safetensors")
    cfg = json.loads((hf_draft / "config.json").read_text())
    del cfg["dflash_config"]["selector_top_k"]
    (draft / "config.json").write_text(json.dumps(cfg))
    rc = main(["--target", str(hf_target), "--draft", str(draft), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "lacks 'selector_top_k'" in err, err
    assert not (tmp_path / "out").exists()


def test_a_missing_or_misshapen_dflash2_tensor_is_named(tmp_path, hf_target, hf_draft):
    sd = load_file(str(hf_draft / "model.safetensors"))
    for edit, match in ((lambda d: d.pop("layers.1.mlp_conv.base_kernel"), "layers.1.mlp_conv.base_kernel.*missing"),
                        (lambda d: d.update({"candidate_selector.successor_codebook": torch.zeros(384, 4)}),
                         "candidate_selector.successor_codebook.*expected \\[384, 8\\]")):
        draft = tmp_path / match[:10].replace(".", "_")
        draft.mkdir()
        bad = dict(sd)
        edit(bad)
        save_file(bad, str(draft / "model.safetensors"), metadata={"format": "pt"})
        (draft / "config.json").write_text((hf_draft / "config.json").read_text())
        with pytest.raises(UserError, match=match):
            load_hf(hf_target, draft, dtype="float32")


# ----------------------------------------------------------------------------- conversion


def test_conversion_round_trip(converted, hf_target, hf_draft):
    """Every HF tensor comes back from the converted checkpoint and from the HF directory read
    straight, at its place in our layout (a linear layer's weight transposed to [in, out])."""
    sd = load_file(str(hf_draft / "model.safetensors"))
    ck = load_checkpoint(converted)
    hf = load_hf(hf_target, hf_draft, dtype="float32")
    assert isinstance(ck.drafter_cfg, dflash2.DFlash2Config) and ck.drafter_cfg == hf.drafter_cfg
    assert ck.meta["drafter"]["architecture"] == "DFlash2DraftModel"
    entries = names.entries_for(ck.drafter_cfg)
    assert {e.hf_name for e in entries} == set(sd)
    for e in entries:
        want = sd[e.hf_name].numpy()
        want = np.swapaxes(want, -1, -2) if e.transpose else want
        for params in (ck.drafter_params, hf.drafter_params):
            np.testing.assert_array_equal(np.asarray(names.get_path(params, e.path)), want, err_msg=e.hf_name)
    assert ck.drafter_params["layers"][1]["attn_conv_kernel"].shape == (64, 2 * 2 * 4)
    assert ck.drafter_params["selector_proj"].shape == (64, 8)


# ----------------------------------------------------------------------------- parity with the public math


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta):  # x [T, heads, d]: rotate-half RoPE at positions pos [T]
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()[:, None]
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()[:, None]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def _conv(x, dyn, base, group):
    """sum_k (base[k, c] + dyn[t, k, c // group]) * x[t - k, c], zero before the block's first row."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(min(base.shape[0], t + 1)):
            out[t] += (base[k] + dyn[t, k].repeat_interleave(group)) * x[t - k]
    return out


def torch_dflash2(draft_dir: Path, taps, block_embeds, ctx_pos, block_pos, head, anchor: int):
    """The DFlash 2 drafter and its greedy selector from the published math, on HF tensors.

    taps [C, nTaps H] (context), block_embeds [bs, H], head [V, H]. Returns (final-normed hidden
    [bs, H], candidates [D, K], greedy path tokens [D], q rows [D, K]: softmax of the score row
    the walk reads, T = 1)."""
    cfg = json.loads((draft_dir / "config.json").read_text())
    dfc = cfg["dflash_config"]
    sd = load_file(str(draft_dir / "model.safetensors"))
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    nh, nkv, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    taps_n, group = dfc["conv_kernel_size"], dfc["conv_group_size"]
    types = cfg["layer_types"]
    flag = cfg.get("is_causal", dfc.get("causal"))
    c = _rms(taps @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
    x = block_embeds * dfc.get("input_embedding_scale", 1.0)
    bs = x.shape[0]
    pos = torch.cat([ctx_pos, block_pos])

    def wrap(name, i, h):  # (prepared input, finish's dynamic part)
        dyn = (h @ sd[f"layers.{i}.{name}.kernel_projection.weight"].T).view(bs, 2, taps_n, -1)
        base = sd[f"layers.{i}.{name}.base_kernel"]
        return _conv(h, dyn[:, 0], base[0], group), lambda y: _conv(y, dyn[:, 1], base[1], group)

    for i in range(cfg["num_hidden_layers"]):
        w = lambda n: sd[f"layers.{i}.{n}.weight"]  # noqa: E731
        h, finish = wrap("attention_conv", i, _rms(x, w("input_layernorm"), eps))
        q = _rms((h @ w("self_attn.q_proj").T).view(bs, nh, dh), w("self_attn.q_norm"), eps)
        kv_in = torch.cat([c, h])
        k = _rms((kv_in @ w("self_attn.k_proj").T).view(-1, nkv, dh), w("self_attn.k_norm"), eps)
        v = (kv_in @ w("self_attn.v_proj").T).view(-1, nkv, dh)
        q, k = _rope(q, block_pos, theta), _rope(k, pos, theta)
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * dh**-0.5
        n_ctx = c.shape[0]
        causal = flag if flag is not None else types[i] == "sliding_attention"
        if causal:
            s[:, :, n_ctx:] = s[:, :, n_ctx:].masked_fill(~torch.ones(bs, bs, dtype=torch.bool).tril(), -torch.inf)
        if types[i] == "sliding_attention":  # keys within the window of the block's last row
            s[:, :, : max(0, k.shape[0] - cfg["sliding_window"])] = -torch.inf
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(bs, -1)
        x = x + finish(o @ w("self_attn.o_proj").T)
        h, finish = wrap("mlp_conv", i, _rms(x, w("post_attention_layernorm"), eps))
        x = x + finish((torch.nn.functional.silu(h @ w("mlp.gate_proj").T) * (h @ w("mlp.up_proj").T))
                       @ w("mlp.down_proj").T)
    hidden = _rms(x, sd["norm.weight"], eps)

    hd = hidden[1:]
    logits = (hd @ head.T) * dfc.get("output_multiplier", 1.0)
    cap = dfc.get("final_logit_softcapping")
    if cap:
        logits = torch.tanh(logits / cap) * cap
    unary, cand = torch.topk(logits, dfc["selector_top_k"], dim=-1)
    proj = hd @ sd["candidate_selector.hidden_projection.weight"].T
    pred_cb, succ_cb = sd["candidate_selector.predecessor_codebook"], sd["candidate_selector.successor_codebook"]
    prev, path, q_rows = anchor, [], []
    for d in range(hd.shape[0]):
        scores = unary[d] + (pred_cb[prev] * proj[d]) @ succ_cb[cand[d]].T
        q_rows.append(torch.softmax(scores, -1))
        prev = int(cand[d, int(torch.argmax(scores))])
        path.append(prev)
    return hidden, cand, torch.tensor(path), torch.stack(q_rows)


VARIANTS = {
    # the published shape: non-causal, two taps, no logit transforms
    "published": dict(),
    # three taps, a causal layer by the legacy rule (no is_causal; its window cuts nothing here),
    # every optional scalar set
    "extras": dict(taps=3, config_edits={"is_causal": _DROP},
                   dflash_edits=dict(output_multiplier=0.5, final_logit_softcapping=5.0, input_embedding_scale=1.5),
                   layer_types=["sliding_attention", "full_attention"], sliding_window=64),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_drafter_and_selector_match_an_independent_torch_implementation(variant, tmp_path, hf_target, hf_draft):
    draft = hf_draft if variant == "published" else make_dflash2(tmp_path / "d", hf_target, seed=5,
                                                                 **VARIANTS[variant])
    ck = load_hf(hf_target, draft, dtype="float32")
    tc, dc = ck.target_cfg, ck.drafter_cfg
    assert dc.causal == ((False, False) if variant == "published" else (True, False))
    rng = np.random.default_rng(3)
    n_ctx, bs = 23, dc.block_size
    taps = torch.tensor(rng.standard_normal((n_ctx, len(dc.target_layer_ids) * tc.hidden_size)), dtype=torch.float32)
    root = int(rng.integers(0, tc.vocab_size - 1))
    block = np.full(bs, dc.mask_token_id)
    block[0] = root
    embed, head = np.asarray(ck.target_params["embed"]), np.asarray(ck.target_params["lm_head"]).T
    ref_h, ref_cand, ref_path, ref_q = torch_dflash2(
        draft, taps, torch.tensor(embed[block]), torch.arange(n_ctx), torch.arange(n_ctx, n_ctx + bs),
        torch.tensor(head), root)

    for layout in ("as converted", "fused"):
        dp = jax.tree_util.tree_map(jnp.asarray, ck.drafter_params)
        if layout == "fused":
            dp = dmodel.fuse_params(dp, stack=True)
        cache = KVCache.zeros(dc.num_layers, 1, dc.num_kv_heads, 64, dc.head_dim, jnp.float32)
        cache = dmodel.extend_cache(dp, dc, cache, jnp.zeros(1, jnp.int32), jnp.asarray(taps.numpy())[None],
                                    jnp.arange(n_ctx, dtype=jnp.int32)[None])
        length = jnp.full(1, n_ctx, jnp.int32)
        embeds, positions = jnp.asarray(embed[block])[None], n_ctx + jnp.arange(bs, dtype=jnp.int32)[None]
        h = dflash2.draft_hidden(dp, dc, embeds, positions, cache, length)
        np.testing.assert_allclose(np.asarray(h[0]), ref_h.numpy(), rtol=2e-4, atol=2e-4, err_msg=layout)
        logits = h[:, 1:] @ jnp.asarray(head.T)
        sel = dflash2.select(dp, dc, h[:, 1:], logits, jnp.asarray([root], jnp.int32))
        np.testing.assert_array_equal(np.asarray(sel.candidates[0]), ref_cand.numpy())
        np.testing.assert_array_equal(np.asarray(dflash2.path_tokens(sel)[0]), ref_path.numpy())
        np.testing.assert_allclose(np.exp(np.asarray(sel.logq[0])), ref_q.numpy(), rtol=1e-4, atol=1e-5)
        # the engine's draft stage: the same log-probs at the candidates, OUTSIDE elsewhere
        logp = dflash2.draft_logp(dp, dc, embeds, positions, cache, length, jnp.asarray([root], jnp.int32),
                                  lambda x: x @ jnp.asarray(head.T))
        logp = np.asarray(logp[0])
        assert logp.shape == (bs - 1, tc.vocab_size)
        np.testing.assert_array_equal(logp.argmax(-1), ref_path.numpy())
        inside = np.take_along_axis(logp, ref_cand.numpy(), axis=-1)
        np.testing.assert_allclose(np.exp(inside), ref_q.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.exp(inside).sum(-1), 1.0, rtol=1e-5)
        assert (np.sort(logp, axis=-1)[:, : -dc.selector_top_k] == dflash2.OUTSIDE).all()
    if variant == "published":  # the selector does reorder: its path is not the head's top-1 chain
        assert (ref_path.numpy() != ref_cand[:, 0].numpy()).any()


def test_grouped_conv_matches_a_loop():
    """Three taps over a block of 5: base per channel, the dynamic part per group of 2, nothing
    from before the block's first row; leading batch axes broadcast."""
    rng = np.random.default_rng(0)
    x, delta, base = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 3, 4)), rng.standard_normal((3, 8))
    got = np.asarray(dflash2.grouped_conv(jnp.asarray(x, jnp.float32), jnp.asarray(delta, jnp.float32),
                                          jnp.asarray(base, jnp.float32), 2))
    want = np.zeros_like(x)
    for b in range(2):
        for t in range(5):
            for k in range(3):
                if t - k >= 0:
                    want[b, t] += (base[k] + np.repeat(delta[b, t, k], 2)) * x[b, t - k]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_selector_with_a_token_map():
    """A drafter drafting over a token map (dflash.restrict_vocab): the head's columns are the
    map's, the codebooks are read at their token ids, and the log-probs come over the map."""
    v, r, bt, d, k = 40, 4, 2, 3, 5
    key = jax.random.PRNGKey(0)
    k1, k2, k3, k4 = jax.random.split(key, 4)
    cfg = dflash2.DFlash2Config(hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                                head_dim=4, rms_eps=1e-6, block_size=d + 1, target_layer_ids=(0,), mask_token_id=v - 1,
                                num_target_layers=2, vocab_size=v, sliding_windows=(None,), conv_kernel_size=2,
                                conv_group_size=4, selector_rank=r, selector_top_k=k)
    dp = {"selector_pred": jax.random.normal(k1, (v, r)), "selector_succ": jax.random.normal(k2, (v, r)),
          "selector_proj": jax.random.normal(k3, (8, r))}
    hidden = jax.random.normal(k4, (bt, d, 8))
    full_logits = jax.random.normal(key, (bt, d, v)) * 3
    ids = jnp.asarray([3, 7, 11, 12, 20, 21, 30, 33, 35], jnp.int32)
    anchor = jnp.asarray([1, 2], jnp.int32)
    mapped = dflash2.select(dp, cfg, hidden, full_logits[..., ids], anchor, ids)
    # the same selection as over the full vocabulary with every other token's logit far below
    masked = jnp.full((bt, d, v), -1e9).at[..., ids].set(full_logits[..., ids])
    full = dflash2.select(dp, cfg, hidden, masked, anchor)
    np.testing.assert_array_equal(np.asarray(ids[mapped.candidates]), np.asarray(full.candidates))
    np.testing.assert_allclose(np.asarray(mapped.logq), np.asarray(full.logq), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(dflash2.path_tokens(mapped, ids)), np.asarray(dflash2.path_tokens(full)))
    assert dflash2.selection_logp(mapped, len(ids)).shape == (bt, d, len(ids))


# ----------------------------------------------------------------------------- the round


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    """A smaller target (fast rounds on the CPU) with a DFlash 2 drafter read straight from HF files."""
    d = tmp_path_factory.mktemp("d2_small")
    target = make_target(d / "t", "qwen3", vocab=128, hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                         intermediate=64)
    draft = make_dflash2(d / "d", target, layers=1, group=8, rank=8, top_k=8, target_layer_ids=(0, 1))
    return load_hf(target, draft, dtype="float32")


PROMPTS = [[5], [3, 9, 17], list(range(10, 23))]
MAX_NEW = 24
SHARED = Executables()


@pytest.mark.parametrize("method,budget", [("dflash", 0), ("ddtree", 4), ("ddtree", 32)])
def test_greedy_rounds_with_a_dflash2_drafter_equal_plain_decoding(small_pair, method, budget, monkeypatch):
    ar = Generator(small_pair, executables=SHARED, method="ar").generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    traced = []
    stage = dflash2.draft_stage
    monkeypatch.setattr(dflash2, "draft_stage", lambda *a, **kw: traced.append(1) or stage(*a, **kw))
    kw = dict(budget=budget) if budget else {}
    res = Generator(small_pair, executables=SHARED, method=method, **kw).generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert traced, "the round did not draft through dflash2.draft_stage"
    assert [r.token_ids for r in res] == [r.token_ids for r in ar]
    assert all(r.num_output_tokens == MAX_NEW for r in res)


def test_token_map_and_int8_drafter_with_dflash2(small_pair):
    """--draft-vocab and --drafter-quant int8 with a DFlash 2 drafter: its selector reads the cut
    int8 head's columns, maps them through the token map, and the rounds stay lossless."""
    ar = Generator(small_pair, executables=SHARED, method="ar").generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    gen = Generator(small_pair, executables=SHARED, method="ddtree", budget=8, draft_vocab=list(range(0, 128, 2)),
                    drafter_quant="int8")
    assert [r.token_ids for r in gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)] == [r.token_ids for r in ar]
