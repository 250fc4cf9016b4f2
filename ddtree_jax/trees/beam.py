"""Beam search tree: beams of `width` paths per depth, the tree is the union of all beams.

Each depth keeps the `width` best extensions (by path score) of the previous depth's beam; the
union over depths is prefix-closed and has no duplicates. It holds up to `width * D` nodes; the
budget keeps the `budget` best of them under DDTree's order (score, then depth, then rank path;
see `ddtree.py`), which keeps it prefix-closed. N = min(budget, width * D); slots that a tiny
vocabulary cannot fill are invalid. `beam:width=B` with budget B equals `ddtree`.
"""
from __future__ import annotations

import dataclasses

from ddtree_jax.trees.base import Array, DraftTree, TreePolicy, check_budget, check_logp, register_policy
from ddtree_jax.trees.ddtree import best_first_tree


@register_policy("beam")
@dataclasses.dataclass(frozen=True)
class BeamPolicy(TreePolicy):
    width: int = 4

    def __post_init__(self) -> None:
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"beam width must be an int >= 1 (e.g. beam:width=4); got {self.width!r}")

    def num_nodes(self, budget: int, depth: int) -> int:
        return min(check_budget(budget), self.width * depth)

    def build(self, logp: Array, budget: int) -> DraftTree:
        budget = check_budget(budget)
        depth = check_logp(logp).shape[1]
        return best_first_tree(logp, budget, width=self.width, num_slots=self.num_nodes(budget, depth),
                               tuning=self.tuning)
