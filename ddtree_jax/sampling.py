"""Choosing the target's token at each position: argmax, or a sample at temperature T with top-k/top-p.

Speculative sampling in DDTree needs nothing more: the target's token is drawn at every tree node
from the target's own (processed) distribution and the walk follows the draws, so the committed
sequence has exactly the distribution of plain sampling.

The draw for the token at absolute position t of batch row b uses the noise of key (seed, b, t)
alone (Gumbel-max), whatever the round, the method or the tree: a committed token's prefix
depends only on the noise of earlier positions, so each token still follows its distribution,
and where the logits agree (float32, or bf16 with --deterministic) AR, DFlash and every DDTree
policy and budget sample the same text for a seed.
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


def _cumsum(x: jax.Array) -> jax.Array:
    """Inclusive sum over the last axis in an order fixed by its length (a row's bits whatever
    the leading dims; XLA's cumsum may pick its association from the whole shape)."""
    return jax.lax.associative_scan(jnp.add, x, axis=-1)


def process_logits(logits: jax.Array, temperature: jax.Array, top_k: int, top_p: jax.Array,
                   deterministic: bool = False) -> jax.Array:
    """Logits [..., V] (float32) -> logits of the distribution actually sampled (masked with -inf).
    deterministic: top-p's sums in an order that does not follow the number of rows."""
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
        if deterministic:  # the max leads the sorted row: exp, then a fixed-order scan
            e = jnp.exp(sorted_x - sorted_x[..., :1])
            cum = _cumsum(e)
            probs, cum = e / cum[..., -1:], cum / cum[..., -1:]
        else:
            probs = jax.nn.softmax(sorted_x, axis=-1)
            cum = jnp.cumsum(probs, axis=-1)
        n_keep = jnp.sum((cum - probs) < top_p, axis=-1, keepdims=True)
        last = jnp.take_along_axis(sorted_x, jnp.maximum(n_keep, 1) - 1, axis=-1)
        return jnp.where(x >= last, x, -jnp.inf)

    return jax.lax.cond(top_p < 1.0, nucleus, lambda x: x, x)


def position_keys(key: jax.Array, positions: jax.Array) -> jax.Array:
    """A key for each (batch row, position): positions int32 [Bt, ...] -> keys [Bt, ..., *key.shape],
    key (seed) folded with the row (axis 0), then the position."""
    rows = jnp.broadcast_to(jnp.arange(positions.shape[0], dtype=jnp.int32).reshape(-1, *[1] * (positions.ndim - 1)),
                            positions.shape)
    fold = jax.vmap(lambda r, p: jax.random.fold_in(jax.random.fold_in(key, r), p))
    keys = fold(rows.reshape(-1), positions.astype(jnp.int32).reshape(-1))
    return keys.reshape(*positions.shape, *keys.shape[1:])


def choose_tokens(
    key: jax.Array,
    logits: jax.Array,
    cfg: SamplingConfig,
    temperature: jax.Array,
    top_p: jax.Array,
    positions: jax.Array,
    deterministic: bool = False,
) -> jax.Array:
    """Target tokens for logits [Bt, ..., V]: argmax when greedy, else a sample per position with
    the noise of (key, row, positions[b, ...]), the absolute position the token will take (module
    doc). deterministic: top-p in a row-count-free order (process_logits)."""
    if cfg.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    x = process_logits(logits, temperature, cfg.top_k, top_p, deterministic)
    keys = position_keys(key, positions).reshape(-1, *key.shape)
    draw = jax.vmap(lambda k, row: jax.random.categorical(k, row))(keys, x.reshape(-1, x.shape[-1]))
    return draw.reshape(x.shape[:-1]).astype(jnp.int32)
