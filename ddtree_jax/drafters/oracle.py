"""A synthetic drafter that knows the target's continuation: for tests and benchmarks.

`oracle_logp` proposes, for the D positions after the root, log-probabilities that put
`strength` extra logit on the token the target will actually produce, on top of a fixed noise
table. With no noise it is a perfect drafter (every round must be accepted to full depth); with
noise it is a drafter of tunable accuracy whose right token is often not the top-1, which
exercises branches of the tree. Params: {"tokens": int32[Bt, L] (prompt + the target's greedy
continuation, by position), "noise": f32[Bt, L, V] or absent, "strength": f32[]}.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def oracle_logp(oparams: dict, length: jax.Array, depth: int, vocab: int) -> jax.Array:
    """logp [Bt, D, V] for positions length+1 .. length+D (the root sits at `length`)."""
    tokens = oparams["tokens"]
    pos = length[:, None] + 1 + jnp.arange(depth, dtype=jnp.int32)
    pos = jnp.minimum(pos, tokens.shape[1] - 1)
    want = jnp.take_along_axis(tokens, pos, axis=1)
    logits = oparams.get("strength", jnp.float32(30.0)) * jax.nn.one_hot(want, vocab, dtype=jnp.float32)
    if "noise" in oparams:
        logits = logits + jnp.take_along_axis(oparams["noise"], pos[:, :, None], axis=1)
    return jax.nn.log_softmax(logits, axis=-1)
