"""The acceptance walk: follow the target's tokens down the draft tree.

From the root, the next slot is the valid child of the current slot whose token equals the
target's token at the current slot; the walk stops when no child matches. The target's token at
the last matched slot is the bonus token. Greedy (argmax) and sampled target tokens walk the
same way, which is what makes the scheme lossless.

Matrix form, no sequential loop: a node is accepted iff every node on its root path (itself
included, the root excluded) is valid and carries the target's token at its parent. Since
sibling tokens are distinct, the accepted nodes form one root path; its deepest node ends the
walk, and the ancestor mask reads the path off by depth. O(Bt * N^2), all on device.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from ddtree_jax.trees.base import Array, DraftTree


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["path", "num_accepted", "bonus", "tokens"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class WalkResult:
    path: Array  # int32[Bt, D+1]: accepted slots from the root (path[:, 0] = 0), then 0
    num_accepted: Array  # int32[Bt]: accepted draft nodes, 0..D
    bonus: Array  # int32[Bt]: the target's token at the last accepted slot
    tokens: Array  # int32[Bt, D+1]: accepted nodes' tokens, then the bonus, then 0


def walk(tree: DraftTree, target_tokens: Array, max_depth: int) -> WalkResult:
    """Accept the longest root path of `tree` that the target agrees with.

    `target_tokens: int32[Bt, N+1]` is the target's token at each slot; `max_depth` (static) is
    the drafter depth D, which fixes the output widths D+1. Nodes deeper than D are never
    accepted.
    """
    target_tokens = jnp.asarray(target_tokens, jnp.int32)
    parent_target = jnp.take_along_axis(target_tokens, jnp.maximum(tree.parents, 0), axis=-1)
    matches = tree.valid & (tree.tokens == parent_target) & (tree.depths <= max_depth)
    matches = matches.at[:, 0].set(True)
    # accepted[b, i] = all over ancestors j of i: matches[b, j]
    accepted = jnp.all(matches[:, None, :] | ~tree.ancestor_mask, axis=-1)
    last = jnp.argmax(jnp.where(accepted, tree.depths, -1), axis=-1).astype(jnp.int32)  # [Bt]
    num_accepted = jnp.take_along_axis(tree.depths, last[:, None], axis=-1)[:, 0]
    bonus = jnp.take_along_axis(target_tokens, last[:, None], axis=-1)[:, 0]

    # path[b, d] = the ancestor of `last` at depth d (0 beyond num_accepted)
    on_path = jnp.take_along_axis(tree.ancestor_mask, last[:, None, None], axis=1)[:, 0]  # [Bt, N+1]
    levels = jnp.arange(max_depth + 1, dtype=jnp.int32)
    at_level = on_path[:, None, :] & (tree.depths[:, None, :] == levels[None, :, None])  # [Bt, D+1, N+1]
    slots = jnp.arange(tree.tokens.shape[-1], dtype=jnp.int32)
    path = jnp.sum(jnp.where(at_level, slots, 0), axis=-1, dtype=jnp.int32)

    drafted = jnp.take_along_axis(tree.tokens, path[:, 1:], axis=-1)  # [Bt, D]
    drafted = jnp.concatenate([drafted, jnp.zeros((drafted.shape[0], 1), drafted.dtype)], axis=1)
    k = levels[None, :]
    n = num_accepted[:, None]
    tokens = jnp.where(k < n, drafted, jnp.where(k == n, bonus[:, None], 0))
    return WalkResult(path=path, num_accepted=num_accepted, bonus=bonus, tokens=tokens)
