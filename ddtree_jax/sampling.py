"""Choosing the target's token at each position: argmax, or a sample at temperature T with top-k/top-p.

Speculative sampling in DDTree needs nothing more: the target's token is drawn independently at
every tree node from the target's own (processed) distribution and the walk follows the draws, so
the committed sequence has exactly the distribution of plain sampling.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static part of the sampling setup (changing it recompiles)."""

    greedy: bool = True
    top_k: int = 0  # 0: off

    @staticmethod
    def make(temperature: float, top_k: int = 0) -> "SamplingConfig":
        return SamplingConfig(greedy=temperature == 0.0, top_k=int(top_k))


def process_logits(logits: jax.Array, temperature: jax.Array, top_k: int, top_p: jax.Array) -> jax.Array:
    """Logits [..., V] (float32) -> logits of the distribution actually sampled (masked with -inf)."""
    x = logits.astype(jnp.float32) / jnp.maximum(temperature, 1e-6)
    v = x.shape[-1]
    if 0 < top_k < v:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    # top-p (nucleus): keep the smallest prefix of the sorted distribution whose mass reaches p
    # (the top token always), i.e. every token whose logit is at least the last kept one's: one
    # sort of the values, then a compare in the original order (no argsort, no inverse
    # permutation, no gathers over the vocabulary). Tokens tied with the last kept one are all
    # kept. The sort only runs when top_p < 1 (a traced choice).
    def nucleus(x):
        sorted_x = -jnp.sort(-x, axis=-1)
        probs = jax.nn.softmax(sorted_x, axis=-1)
        n_keep = jnp.sum((jnp.cumsum(probs, axis=-1) - probs) < top_p, axis=-1, keepdims=True)
        last = jnp.take_along_axis(sorted_x, jnp.maximum(n_keep, 1) - 1, axis=-1)
        return jnp.where(x >= last, x, -jnp.inf)

    return jax.lax.cond(top_p < 1.0, nucleus, lambda x: x, x)


def choose_tokens(
    key: jax.Array,
    logits: jax.Array,
    cfg: SamplingConfig,
    temperature: jax.Array,
    top_p: jax.Array,
) -> jax.Array:
    """Target tokens for logits [..., V]: argmax when greedy, else independent samples per position."""
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    x = process_logits(logits, temperature, cfg.top_k, top_p)
    return jax.random.categorical(key, x, axis=-1).astype(jnp.int32)
