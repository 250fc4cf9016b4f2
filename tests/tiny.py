"""Tiny random target/drafter pairs built directly in JAX (no Hugging Face files), for engine tests."""
from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.generator import Generator
from ddtree_jax.models.config import DrafterConfig, MoeConfig, TargetConfig
from ddtree_jax.models.init import init_drafter, init_target


def tiny_pair(vocab=64, layers=2, block_size=8, seed=0, draft_layers=1, window=None, moe=False):
    """moe=True: a Qwen3-MoE target (8 experts of width 16, top 2, renormalised; every layer sparse)."""
    moe_cfg = MoeConfig(num_experts=8, top_k=2, expert_intermediate=16, norm_topk_prob=True,
                        sparse_layers=(True,) * layers) if moe else None
    tc = TargetConfig(family="qwen3_moe" if moe else "qwen3", vocab_size=vocab, hidden_size=32, intermediate_size=64,
                      num_layers=layers, num_heads=4, num_kv_heads=2, head_dim=8, rms_eps=1e-6, max_position=4096,
                      tie_embeddings=False, qk_norm=True, qkv_bias=False, moe=moe_cfg)
    dc = DrafterConfig(hidden_size=32, intermediate_size=64, num_layers=draft_layers, num_heads=4, num_kv_heads=2,
                       head_dim=8, rms_eps=1e-6, block_size=block_size, target_layer_ids=tuple(range(min(2, layers))),
                       mask_token_id=vocab - 1, num_target_layers=layers, vocab_size=vocab,
                       sliding_windows=(window,) * draft_layers)
    tp = init_target(tc, jax.random.PRNGKey(seed))
    # Sharper logits than the default init, so that sampled tests see a non-uniform distribution.
    tp["lm_head"] = tp["lm_head"] * 4.0
    dp = init_drafter(dc, jax.random.PRNGKey(seed + 1))
    return types.SimpleNamespace(target_cfg=tc, target_params=tp, drafter_cfg=dc, drafter_params=dp,
                                 tokenizer_dir=None, meta={})


def oracle_extra(ckpt) -> int:
    """Greedy tokens an oracle needs beyond max_new (a round drafts a block past the last one)."""
    return ckpt.drafter_cfg.block_size + 2


def oracle_params(ckpt, prompts, max_new, noise=0.0, seed=0, greedy=None):
    """Oracle drafter params: prompt + the target's greedy continuation, right-padded per row.
    greedy: those continuations if already generated (max_new + oracle_extra tokens a row)."""
    extra = oracle_extra(ckpt)
    if greedy is None:
        greedy = [r.token_ids for r in Generator(ckpt, method="ar").generate_ids(prompts,
                                                                                max_new_tokens=max_new + extra)]
    length = max(len(p) for p in prompts) + max_new + extra + 1
    tokens = np.zeros((len(prompts), length), np.int32)
    for i, (p, r) in enumerate(zip(prompts, greedy)):
        seq = list(p) + list(r)
        tokens[i, : len(seq)] = seq
    params = {"tokens": jnp.asarray(tokens), "strength": jnp.float32(30.0 if noise == 0 else 1.0)}
    if noise:
        v = ckpt.target_cfg.vocab_size
        params["noise"] = noise * jax.random.normal(jax.random.PRNGKey(seed), (len(prompts), length, v))
    return params
