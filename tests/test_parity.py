"""Parity with Hugging Face transformers (PyTorch, float32) on tiny random checkpoints.

Targets: logits and every tapped hidden state of the converted checkpoint match transformers;
greedy generation is token-identical. Drafter: an independent PyTorch DFlash implementation,
written here from DESIGN.md's description, matches our drafter (incremental context cache, sliding
windows included).
"""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from ddtree_jax.checkpoint import load_checkpoint
from ddtree_jax.generator import Generator
from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.models import target as tmodel
from ddtree_jax.models.layers import KVCache
from hf_fixtures import make_drafter

torch.manual_seed(0)


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()


def _close(ours, ref, what):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    err = np.max(np.abs(ours - ref))
    assert err <= 1e-4 * np.max(np.abs(ref)), f"{what}: max abs diff {err:.3g} vs max |ref| {np.max(np.abs(ref)):.3g}"


@pytest.mark.parametrize("name", ["qwen3_pair", "llama_target", "qwen2_sharded"])
def test_logits_and_hidden_states_match_transformers(name, request):
    conv = request.getfixturevalue(name)
    ck = load_checkpoint(conv.out, with_drafter=False)
    hf = _hf(conv.hf_target)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, ck.target_cfg.vocab_size, size=(2, 37))
    with torch.no_grad():
        out = hf(torch.tensor(tokens), output_hidden_states=True)
    taps = tuple(range(ck.target_cfg.num_layers))
    logits, hidden = tmodel.forward_train(ck.target_params, ck.target_cfg, jnp.asarray(tokens, jnp.int32), taps=taps)
    _close(logits, out.logits.numpy(), f"{name} logits")
    h = ck.target_cfg.hidden_size
    for i in taps[:-1]:  # HF's last hidden state is after the final norm
        _close(hidden[..., i * h:(i + 1) * h], out.hidden_states[i + 1].numpy(), f"{name} hidden state of layer {i}")


@pytest.mark.parametrize("name", ["qwen3_pair", "llama_target", "qwen2_sharded"])
def test_greedy_generation_matches_transformers(name, request):
    conv = request.getfixturevalue(name)
    ck = load_checkpoint(conv.out, with_drafter=False)
    hf = _hf(conv.hf_target)
    prompt = [5, 17, 42, 7, 99, 3]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    ref = ref[0, len(prompt):].tolist()
    ours = Generator(ck, method="ar").generate_ids([prompt], max_new_tokens=32)[0].token_ids
    assert ours == ref


def test_speculative_on_converted_pair_matches_transformers(qwen3_pair):
    ck = load_checkpoint(qwen3_pair.out)
    hf = _hf(qwen3_pair.hf_target)
    prompt = [11, 12, 13, 200, 201, 5]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    for method, budget in [("dflash", 0), ("ddtree", 32)]:
        got = Generator(ck, method=method, budget=budget or 32).generate_ids([prompt], max_new_tokens=32)[0]
        assert got.token_ids == ref, method


# ------------------------------------------------------------------ an independent PyTorch DFlash


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, theta):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = pos.double()[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).float(), torch.cat([ang.sin(), ang.sin()], -1).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


def torch_dflash(draft_dir, target_hidden, block_embeds, ctx_pos, block_pos):
    """Reference DFlash drafter, written from DESIGN.md. target_hidden: [C, nTaps*H]; block: [bs, H]."""
    cfg = json.loads((draft_dir / "config.json").read_text())
    sd = load_file(str(draft_dir / "model.safetensors"))
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    nh, nkv, dh = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    types = cfg.get("layer_types") or ["full_attention"] * cfg["num_hidden_layers"]
    c = _rms(target_hidden @ sd["fc.weight"].T, sd["hidden_norm.weight"], eps)
    x = block_embeds
    pos = torch.cat([ctx_pos, block_pos])
    for i in range(cfg["num_hidden_layers"]):
        w = lambda n: sd[f"layers.{i}.{n}.weight"]  # noqa: E731
        h = _rms(x, w("input_layernorm"), eps)
        q = _rms((h @ w("self_attn.q_proj").T).view(-1, nh, dh), w("self_attn.q_norm"), eps)
        kv_in = torch.cat([c, h])
        k = _rms((kv_in @ w("self_attn.k_proj").T).view(-1, nkv, dh), w("self_attn.k_norm"), eps)
        v = (kv_in @ w("self_attn.v_proj").T).view(-1, nkv, dh)
        q, k = _rope(q, block_pos, theta), _rope(k, pos, theta)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        s = torch.einsum("qhd,khd->hqk", q, k) * dh**-0.5
        if types[i] == "sliding_attention":
            n_keys = k.shape[0]
            s[:, :, : max(0, n_keys - cfg["sliding_window"])] = -torch.inf
        o = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(x.shape[0], -1)
        x = x + o @ w("self_attn.o_proj").T
        hm = _rms(x, w("post_attention_layernorm"), eps)
        x = x + (torch.nn.functional.silu(hm @ w("mlp.gate_proj").T) * (hm @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    return _rms(x, sd["norm.weight"], eps)


@pytest.mark.parametrize("window", [None, 11])
def test_drafter_matches_independent_torch(qwen3_pair, tmp_path, window):
    from convert import main as convert_main

    draft_dir = qwen3_pair.hf_draft
    if window is not None:
        types = ["sliding_attention", "full_attention"]
        draft_dir = make_drafter(tmp_path / "draft_sw", qwen3_pair.hf_target, layers=2, block_size=8,
                                 target_layer_ids=[1, 2], sliding_window=window, layer_types=types, seed=3)
        out = tmp_path / "conv"
        assert convert_main(["--target", str(qwen3_pair.hf_target), "--draft", str(draft_dir), "--out", str(out),
                             "--dtype", "float32"]) == 0
    else:
        out = qwen3_pair.out
    ck = load_checkpoint(out)
    tc, dc = ck.target_cfg, ck.drafter_cfg
    hf = _hf(qwen3_pair.hf_target)
    rng = np.random.default_rng(1)
    n_ctx, bs = 23, dc.block_size
    seq = rng.integers(0, tc.vocab_size - 1, size=n_ctx + 1)
    with torch.no_grad():
        hs = hf(torch.tensor(seq[None]), output_hidden_states=True).hidden_states
    taps = torch.cat([hs[i + 1][0, :n_ctx] for i in dc.target_layer_ids], -1)
    block = np.full(bs, dc.mask_token_id)
    block[0] = seq[n_ctx]
    emb = hf.model.embed_tokens(torch.tensor(block)).detach()
    ref = torch_dflash(draft_dir, taps, emb, torch.arange(n_ctx), torch.arange(n_ctx, n_ctx + bs))
    with torch.no_grad():
        ref_logits = hf.lm_head(ref[1:]).numpy()

    # ours: the context arrives in two pieces (prefill, then one round's worth), as in generation
    cache = KVCache.zeros(dc.num_layers, 1, dc.num_kv_heads, 64, dc.head_dim, jnp.float32)
    taps_j = jnp.asarray(taps.numpy())[None]
    pos = jnp.arange(n_ctx, dtype=jnp.int32)[None]
    split = 15
    cache = dmodel.extend_cache(ck.drafter_params, dc, cache, jnp.zeros(1, jnp.int32), taps_j[:, :split], pos[:, :split])
    pad = jnp.zeros((1, dc.block_size - (n_ctx - split), taps_j.shape[-1]))  # a fixed-size chunk, partly unused
    chunk = jnp.concatenate([taps_j[:, split:], pad], axis=1)
    chunk_pos = split + jnp.arange(chunk.shape[1], dtype=jnp.int32)[None]
    cache = dmodel.extend_cache(ck.drafter_params, dc, cache, jnp.full(1, split, jnp.int32), chunk, chunk_pos)
    h = dmodel.draft_hidden(ck.drafter_params, dc, tmodel.embed(ck.target_params, jnp.asarray(block[None], jnp.int32)),
                            n_ctx + jnp.arange(bs, dtype=jnp.int32)[None], cache, jnp.full(1, n_ctx, jnp.int32))
    logits = tmodel.lm_head(ck.target_params, tc, h[:, 1:])[0]
    _close(logits, ref_logits, f"drafter logits (window={window})")
