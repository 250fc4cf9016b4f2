"""A fixed tree of rank paths (EAGLE/Medusa style): the same shape every round.

Syntax: `static:tree=0;1;0.0;0.1;1.0` -- nodes separated by `;`, each node the ranks along its
path from the root separated by `.` (`0.1` = the 2nd-ranked token at depth 2 below the top
token at depth 1). Every node's parent must be listed before it (that makes the tree
prefix-closed and the listing a topological order); no duplicates. Slots follow the listed
order; a budget smaller than the tree keeps the first `budget` nodes, which is again a tree.
At build time every kept node must satisfy depth <= D and rank < V.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from ddtree_jax.trees.base import Array, DraftTree, TreePolicy, check_budget, check_logp, register_policy, tree_from_nodes

SYNTAX = "static:tree=0;1;0.0 (nodes split by ';', the ranks of a node's path split by '.', parents first)"


def parse_static_tree(text: str) -> tuple[tuple[int, ...], ...]:
    """Parse and validate the rank paths of a static tree; ValueError names the bad node."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty static tree; expected {SYNTAX}")
    paths: list[tuple[int, ...]] = []
    seen: set[tuple[int, ...]] = set()
    for item in text.split(";"):
        item = item.strip()
        try:
            path = tuple(int(r) for r in item.split("."))
        except ValueError:
            raise ValueError(f"bad node {item!r} in static tree {text!r}; expected {SYNTAX}") from None
        if any(r < 0 for r in path):
            raise ValueError(f"negative rank in node {item!r} of static tree {text!r}; ranks start at 0")
        if path in seen:
            raise ValueError(f"node {item!r} appears twice in static tree {text!r}")
        if len(path) > 1 and path[:-1] not in seen:
            parent = ".".join(map(str, path[:-1]))
            raise ValueError(f"node {item!r} of static tree {text!r} needs its parent {parent!r} listed before it")
        seen.add(path)
        paths.append(path)
    return tuple(paths)


@register_policy("static")
@dataclasses.dataclass(frozen=True)
class StaticPolicy(TreePolicy):
    tree: str
    paths: tuple[tuple[int, ...], ...] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", parse_static_tree(self.tree))

    def num_nodes(self, budget: int, depth: int) -> int:
        return min(check_budget(budget), len(self.paths))

    def build(self, logp: Array, budget: int) -> DraftTree:
        logp = check_logp(logp)
        batch, depth, vocab = logp.shape
        paths = self.paths[: self.num_nodes(budget, depth)]
        if any(len(p) > depth for p in paths):
            raise ValueError(f"static tree {self.tree!r} is deeper than the drafter's {depth} positions; shorten it")
        if any(max(p) >= vocab for p in paths):
            raise ValueError(f"static tree {self.tree!r} uses a rank >= the vocabulary size {vocab}")
        index = {p: i + 1 for i, p in enumerate(paths)}
        parents = np.array([index.get(p[:-1], 0) for p in paths], np.int32)
        depths = np.array([len(p) for p in paths], np.int32)
        ranks = np.array([p[-1] for p in paths], np.int32)
        toks = jax.lax.top_k(logp, int(ranks.max(initial=0)) + 1)[1]  # [Bt, D, R]
        tokens = toks[:, np.maximum(depths - 1, 0), ranks]
        shape = (batch, len(paths))
        return tree_from_nodes(
            tokens,
            np.broadcast_to(parents, shape),
            np.broadcast_to(depths, shape),
            num_nodes=len(paths),
            max_depth=depth,
            tuning=self.tuning,
        )
