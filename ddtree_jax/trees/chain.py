"""DFlash's chain: the top-1 token at each depth, one path of `min(budget, D)` nodes.

With `budget = D` this is plain DFlash speculative decoding.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ddtree_jax.trees.base import Array, DraftTree, TreePolicy, check_budget, check_logp, register_policy, tree_from_nodes


@register_policy("chain")
@dataclasses.dataclass(frozen=True)
class ChainPolicy(TreePolicy):
    """Slot i (1..N) is the depth-i node; its parent is slot i-1."""

    def num_nodes(self, budget: int, depth: int) -> int:
        return min(check_budget(budget), depth)

    def build(self, logp: Array, budget: int) -> DraftTree:
        logp = check_logp(logp)
        batch, depth, _ = logp.shape
        n = self.num_nodes(budget, depth)
        tokens = jax.lax.top_k(logp[:, :n], 1)[1][..., 0]  # same tie rule as every policy
        steps = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (batch, n))
        return tree_from_nodes(tokens, parents=steps, depths=steps + 1, num_nodes=n, max_depth=depth,
                               tuning=self.tuning)
