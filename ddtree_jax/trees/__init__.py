"""Tree policies: which draft nodes the target verifies each round.

    from ddtree_jax.trees import make_policy
    from ddtree_jax.tuning import tuning_for
    policy = make_policy("ddtree")              # or "chain", "beam:width=4", "static:tree=0;1;0.0"
    policy = policy.with_tuning(tuning_for().tree)  # this device's fast paths; the same tree
    n = policy.num_nodes(budget, depth)         # static node count N of the tree
    tree = policy.build(logp, budget)           # logp: float[Bt, D, V]; budget static under jit

`build` returns a `DraftTree` (see `base.py` for its conventions). Built-in policies: `ddtree`
(best-first, the paper's), `chain` (DFlash), `beam` (option `width`), `static` (option `tree`).

Adding a policy takes one new file, no engine change:

    # ddtree_jax/trees/mine.py
    import dataclasses
    import jax.numpy as jnp
    from ddtree_jax.trees.base import TreePolicy, check_budget, check_logp, register_policy, tree_from_nodes

    @register_policy("mine")                    # usable as --tree "mine:depth_cap=3"
    @dataclasses.dataclass(frozen=True)         # fields = options, parsed from the spec text
    class MyPolicy(TreePolicy):
        depth_cap: int = 4

        def num_nodes(self, budget, depth):     # static N; must not depend on data
            return min(check_budget(budget), depth, self.depth_cap)

        def build(self, logp, budget):          # jit-able: static shapes, no host loops over data
            logp = check_logp(logp)
            batch, depth, _ = logp.shape
            n = self.num_nodes(budget, depth)
            tokens = jnp.argmax(logp[:, :n], axis=-1)           # int32[Bt, n], root excluded
            slots = jnp.broadcast_to(jnp.arange(n), (batch, n))
            return tree_from_nodes(tokens, parents=slots, depths=slots + 1, num_nodes=n, max_depth=depth,
                                   tuning=self.tuning)          # inherited: how this device builds it

and nothing else: every module of this package is imported (and so registered) when
`ddtree_jax.trees` is. Rules: parents before children (slot index), sibling tokens
distinct, at most `num_nodes(budget, D)` slots; `tests/test_trees.py` checks every registered
policy against these rules automatically.
"""
from __future__ import annotations

from ddtree_jax.trees.base import (
    DraftTree,
    TreePolicy,
    ancestor_mask_from_parents,
    available_policies,
    make_policy,
    register_policy,
    tree_from_nodes,
)

# Importing a policy module registers it: every module in this package is imported, so a new
# policy file needs no edit anywhere else.
import importlib as _importlib  # noqa: E402
import pkgutil as _pkgutil  # noqa: E402

for _mod in _pkgutil.iter_modules(__path__):
    if _mod.name != "base":
        _importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = [
    "DraftTree",
    "TreePolicy",
    "ancestor_mask_from_parents",
    "available_policies",
    "make_policy",
    "register_policy",
    "tree_from_nodes",
]
