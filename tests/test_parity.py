"""Parity with Hugging Face transformers (PyTorch, float32) on tiny random checkpoints.

Targets (dense, and MoE: Qwen3-MoE, Qwen2-MoE with its shared expert): logits and every tapped
hidden state of the converted checkpoint match transformers'
(tap i is hidden_states[i + 1], for the last layer the final-normed state); greedy generation is
token-identical. Drafter: an independent PyTorch DFlash implementation, written here from
DESIGN.md's description, matches our drafter (incremental context cache, sliding windows
included). A drafter tapping the target's last layer gets what transformers hands out, in training,
prefill and verify, and its greedy DFlash / DDTree rounds accept what a plain reference loop
(transformers' hidden states, that drafter, the target's greedy tokens) accepts.
"""
from __future__ import annotations

import heapq
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
from ddtree_jax.models.layers import KVCache, append
from ddtree_jax.tuning import CPU_KERNELS
from hf_fixtures import make_drafter

torch.manual_seed(0)


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32).eval()


def _close(ours, ref, what):
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    err = np.max(np.abs(ours - ref))
    assert err <= 1e-4 * np.max(np.abs(ref)), f"{what}: max abs diff {err:.3g} vs max |ref| {np.max(np.abs(ref)):.3g}"


TARGETS = ["qwen3_pair", "llama_target", "qwen2_sharded", "qwen3_moe_pair", "qwen2_moe_sharded"]


@pytest.mark.parametrize("name", TARGETS)
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
    for i in taps:  # the last is after the final norm, in both
        _close(hidden[..., i * h:(i + 1) * h], out.hidden_states[i + 1].numpy(), f"{name} hidden state of layer {i}")


@pytest.mark.parametrize("name", TARGETS)
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


@pytest.mark.parametrize("name", ["qwen3_pair", "qwen3_moe_pair"])
def test_speculative_on_converted_pair_matches_transformers(name, request):
    pair = request.getfixturevalue(name)
    ck = load_checkpoint(pair.out)
    hf = _hf(pair.hf_target)
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
        flag = cfg.get("is_causal", cfg["dflash_config"].get("causal"))
        if flag if flag is not None else types[i] == "sliding_attention":  # z-lab's default: sliding layers causal
            n_ctx = c.shape[0]
            later = torch.ones(x.shape[0], x.shape[0], dtype=torch.bool).triu(1)
            s[:, :, n_ctx:] = s[:, :, n_ctx:].masked_fill(later, -torch.inf)
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


# ------------------------------------------------------------------ a drafter tapping the target's last layer


def test_last_layer_tap_is_what_transformers_hands_the_drafter(qwen3_last_tap):
    """Taps [1, 3] of a 4-layer target: tap 3 is hidden_states[4], the final-normed state (the
    final norm's weights are far from 1 here, so the raw output of layer 3 would be far off), tap 1
    hidden_states[2]; in training (forward_train), in a prefill and in a verify pass over its cache
    (XLA's layers and the fused-kernel ones), and so are the drafter's context features."""
    ck = load_checkpoint(qwen3_last_tap.out)
    tc, dc = ck.target_cfg, ck.drafter_cfg
    ids = dc.target_layer_ids
    assert tc.num_layers - 1 in ids
    hf = _hf(qwen3_last_tap.hf_target)
    n, split = 30, 21
    seq = np.random.default_rng(2).integers(0, tc.vocab_size, size=(1, n))
    with torch.no_grad():
        hs = hf(torch.tensor(seq), output_hidden_states=True).hidden_states
    want = torch.cat([hs[i + 1] for i in ids], -1)
    tokens = jnp.asarray(seq, jnp.int32)
    _, got = tmodel.forward_train(ck.target_params, tc, tokens, taps=ids)
    _close(got, want.numpy(), "training taps")

    pos = jnp.arange(n, dtype=jnp.int32)[None]
    zero = jnp.zeros(1, jnp.int32)
    for impl, params in [("xla", ck.target_params), ("pallas_interpret", tmodel.fuse_params(ck.target_params))]:
        kernels = CPU_KERNELS.with_impls(matmul=impl)
        cache = KVCache.zeros(tc.num_layers, 1, tc.num_kv_heads, 64, tc.head_dim, jnp.float32)
        _, pre, (k, v) = tmodel.forward(params, tc, tokens[:, :split], pos[:, :split], cache, zero,
                                        tmodel.causal_mask(1, split), taps=ids,
                                        kernels=CPU_KERNELS.with_impls(matmul="xla"))
        cache = append(cache, k, v, zero)
        rows = n - split
        assert tmodel._fused_layers(params, tc, (1, rows, tc.hidden_size), kernels) == (impl != "xla")
        _, ver, _ = tmodel.forward(params, tc, tokens[:, split:], pos[:, split:], cache, jnp.full(1, split, jnp.int32),
                                   tmodel.causal_mask(1, rows), taps=ids, kernels=kernels)
        _close(jnp.concatenate([pre, ver], axis=1), want.numpy(), f"prefill and verify taps ({impl})")

    sd = load_file(str(qwen3_last_tap.hf_draft / "model.safetensors"))
    ref = _rms(want[0] @ sd["fc.weight"].T, sd["hidden_norm.weight"], dc.rms_eps)
    _close(dmodel.context_features(ck.drafter_params, dc, got[0]), ref.numpy(), "context features")


def _best_first_paths(logp: np.ndarray, budget: int) -> set[tuple[int, ...]]:
    """DDTree's tree the classic way (trees/ddtree.py): pop the best rank path, push its next
    sibling and its first child, keyed by (-score, depth, the parent's pop index, rank); the first
    `budget` popped, as token paths. logp: [depth, V]."""
    depth, vocab = logp.shape
    k = min(budget, vocab)
    order = np.argsort(-logp, axis=1, kind="stable")[:, :k]
    vals = np.take_along_axis(logp, order, axis=1)

    def key(ranks, parent):
        return (-sum(vals[i, r] for i, r in enumerate(ranks)), len(ranks), parent, ranks[-1], ranks)

    heap, paths = [key((0,), -1)], []
    while heap and len(paths) < budget:
        *_, parent, _, ranks = heapq.heappop(heap)
        me = len(paths)
        paths.append(tuple(int(order[i, r]) for i, r in enumerate(ranks)))
        if ranks[-1] + 1 < k:
            heapq.heappush(heap, key(ranks[:-1] + (ranks[-1] + 1,), parent))
        if len(ranks) < depth:
            heapq.heappush(heap, key(ranks + (0,), me))
    return set(paths)


def reference_acceptance(hf, draft_dir, dc, prompt: list[int], ar: list[int], n: int, budget: int) -> list[int]:
    """Per-round acceptance lengths of greedy DFlash (budget 0) or DDTree (budget B) generating n
    tokens, computed the plain way: ar is the target's greedy continuation (a block past n); a
    round's root ar[j] sits at position P + j, the drafter (torch_dflash) sees transformers' taps of
    every position before it, the drafts are its argmax tokens (DFlash) or its `budget` best paths
    (DDTree), and the round accepts the longest prefix of ar[j+1:] among them, plus the bonus."""
    p, bs = len(prompt), dc.block_size
    with torch.no_grad():
        hs = hf(torch.tensor([prompt + ar]), output_hidden_states=True).hidden_states
        taps = torch.cat([hs[i + 1][0] for i in dc.target_layer_ids], -1)
        acc, j = [], 0
        while j + 1 < n:
            c = p + j
            block = torch.full((bs,), dc.mask_token_id)
            block[0] = ar[j]
            h = torch_dflash(draft_dir, taps[:c], hf.model.embed_tokens(block), torch.arange(c), torch.arange(c, c + bs))
            logp = torch.log_softmax(hf.lm_head(h[1:]).double(), -1).numpy()
            want = ar[j + 1: j + bs]
            chain = logp.argmax(-1).tolist()
            drafted = _best_first_paths(logp, budget) if budget else {tuple(chain[:d]) for d in range(1, bs)}
            k = 0
            while k < len(want) and tuple(want[:k + 1]) in drafted:
                k += 1
            acc.append(k + 1)
            j += k + 1
    return acc


@pytest.mark.parametrize("method,budget", [("dflash", 0), ("ddtree", 32)])
def test_last_layer_tap_drafter_is_lossless_and_accepts_as_the_reference(qwen3_last_tap, method, budget):
    """Greedy DFlash / DDTree with a drafter reading the last layer's tap: transformers' greedy
    tokens, and every round's acceptance length as reference_acceptance computes it."""
    ck = load_checkpoint(qwen3_last_tap.out)
    dc = ck.drafter_cfg
    hf = _hf(qwen3_last_tap.hf_target)
    prompt, n = [5, 17, 42, 7, 99, 3], 48
    with torch.no_grad():
        ar = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n + dc.block_size, do_sample=False, eos_token_id=None,
                         pad_token_id=0)[0, len(prompt):].tolist()
    got = Generator(ck, method=method, budget=budget or 32).generate_ids([prompt], max_new_tokens=n)[0]
    assert got.token_ids == ar[:n]
    ref = reference_acceptance(hf, qwen3_last_tap.hf_draft, dc, prompt, ar, n, budget)
    assert got.acceptance_lengths == ref
    assert max(ref) >= 4, ref  # whole runs accepted: the comparison above has teeth
