"""Replay: a tree policy's greedy rounds over a record, exactly as the engine runs them, without
the models.

For greedy decoding the committed sequence is the same for every lossless policy, so a round
rooted at output j is a function of the policy, the budget and the recorded drafts at j alone:

  tree     the policy's own `build` over the recorded top-K log-probs [D, K] (its indices are
           ranks; they map back to token ids through the record, as a token map's do in
           `engine.tree_stage`);
  walk     the rule of `ddtree_jax.walk.walk` with the greedy sequence as the target's tokens: a
           node is accepted where it and every node above it carry the greedy token of their
           depth (on the accepted path the target computes exactly those; off it nothing counts);
  commit   accepted + 1 tokens (the bonus), the next root j + accepted + 1; the round that
           reaches max_new_tokens or emits a stop id is the last, as in `engine.commit_stage`.

Trees and walks run for every root at once (batched, jitted); the hop from root to root is a
short numpy loop. Sampling (temperature > 0) is not replayed: acceptance there depends on the
target's distributions off the greedy path, which a record does not hold.

Exactness against the engine needs K (the record's top-K) to cover every rank a policy reads:
`ranks_needed`. The numbers are float32 engine numbers: the record's batched drafter pass and
the engine's per-round pass round differently in the last bits, which changes a tree only where
two candidates tie to ~1e-7 (tests/test_research.py compares them round for round).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.errors import UserError
from ddtree_jax.research.store import Record
from ddtree_jax.trees import TreePolicy, make_policy
from ddtree_jax.trees.beam import BeamPolicy
from ddtree_jax.trees.chain import ChainPolicy
from ddtree_jax.trees.ddtree import DDTreePolicy
from ddtree_jax.trees.static import StaticPolicy
from ddtree_jax.tuning import tuning_for

# A budget: a node count, or a function of the path log-probs [R, N] (slot order; -inf at padding
# slots) of a round's trees that returns how many of their first slots to keep, int [R] in 0..N.
Budget = int | Callable[[np.ndarray], np.ndarray]
# Roots x tree slots one jitted call takes (its tree build's selections grow with both).
CALL_SLOTS = 1 << 20
CALLS_IN_FLIGHT = 2


def ranks_needed(policy: TreePolicy, budget: int, depth: int) -> int:
    """The top-K a record needs for `policy` at `budget` to replay exactly: the most ranks a depth
    of its tree can read. chain: 1. ddtree: the budget (it ranks the top `budget` tokens a depth).
    beam: min(width, budget) (the beam's top `width`, and no node of rank >= budget is among the
    budget best). static: the largest rank among its first `budget` nodes, plus 1. A policy may
    state its own (a `ranks_needed(budget, depth)` method); others are taken to read at most
    their node count (`num_nodes`), which tests/test_research.py checks for every registered
    policy."""
    own = getattr(policy, "ranks_needed", None)
    if own is not None:
        return int(own(budget, depth))
    if isinstance(policy, ChainPolicy):
        return 1
    if isinstance(policy, DDTreePolicy):
        return budget
    if isinstance(policy, BeamPolicy):
        return min(policy.width, budget)
    if isinstance(policy, StaticPolicy):
        return 1 + max((p[-1] for p in policy.paths[:policy.num_nodes(budget, depth)]), default=0)
    return policy.num_nodes(budget, depth)


@dataclasses.dataclass
class PromptReplay:
    acceptance_lengths: list[int]  # tokens committed by each round (accepted + the bonus)
    nodes: list[int]  # draft nodes verified by each round

    @property
    def rounds(self) -> int:
        return len(self.acceptance_lengths)

    @property
    def mean_acceptance(self) -> float:
        """As the engine's Result.mean_acceptance."""
        return float(np.mean(self.acceptance_lengths)) if self.acceptance_lengths else 0.0


@dataclasses.dataclass
class ReplayResult:
    policy: str
    budget: int | str  # "auto" where a function chose it
    depth: int
    prompts: list[PromptReplay]

    @property
    def rounds(self) -> int:
        return sum(p.rounds for p in self.prompts)

    @property
    def mean_acceptance(self) -> float:
        """Tokens a round, pooled over every prompt's rounds (as the bench suite's)."""
        acc = [a for p in self.prompts for a in p.acceptance_lengths]
        return float(np.mean(acc)) if acc else 0.0

    @property
    def mean_nodes(self) -> float:
        nodes = [n for p in self.prompts for n in p.nodes]
        return float(np.mean(nodes)) if nodes else 0.0

    @property
    def histogram(self) -> list[int]:
        """Rounds that committed 1, 2, ..., D + 1 tokens."""
        acc = np.asarray([a for p in self.prompts for a in p.acceptance_lengths], np.int64)
        return np.bincount(acc, minlength=self.depth + 2)[1:].tolist()

    def to_json(self) -> dict:
        return {"policy": self.policy, "budget": self.budget, "rounds": self.rounds,
                "mean_acceptance": self.mean_acceptance, "mean_nodes": self.mean_nodes,
                "histogram": self.histogram,
                "prompts": [{"rounds": p.rounds, "mean_acceptance": p.mean_acceptance,
                             "acceptance_lengths": p.acceptance_lengths} for p in self.prompts]}


def policy_for(spec: str | TreePolicy) -> TreePolicy:
    """The policy of a spec ("ddtree", "beam:width=4", ...), built with this device's tuning; one
    UserError line for a bad spec."""
    try:
        return make_policy(spec).with_tuning(tuning_for().tree)
    except ValueError as e:
        raise UserError(f"--tree-policy: {e}") from None


def check_replayable(rec: Record, policy: TreePolicy, budget: int) -> None:
    """Refuse a budget this record cannot replay exactly (its top-K too small), or a bad one."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 1:
        raise UserError(f"budget must be an int >= 1 (got {budget!r})")
    need = ranks_needed(policy, budget, rec.depth)
    if need > rec.top_k:
        raise UserError(f"{policy.spec} at budget {budget} reads the top {need} tokens a depth and the record keeps "
                        f"{rec.top_k}; record again with --top-k {need} or more")


def replay(rec: Record, policy: str | TreePolicy, budget: Budget, *, max_budget: int | None = None,
           max_new_tokens: int | None = None, stop: bool = True, progress=None) -> ReplayResult:
    """Score `policy` over the record's prompts as the engine's greedy rounds would.

    budget: the nodes a round verifies (an int, as `--budget`), or a function that picks them per
    round: it gets the path log-probs of every root's tree at `max_budget` nodes (float32 [R, N],
    the sum of the drafter's log-probs along each node's root path, in slot order, -inf at padding
    slots) and returns how many of the first slots to keep (int [R], 0..N). Slots are in the
    policy's order (best first for ddtree and beam), so the kept slots are again a tree: the
    policy's tree at that budget, for ddtree. max_budget: the tree the function prunes (required
    with a function). max_new_tokens: at most the record's (default). stop: end a prompt at the
    record's stop ids (its tokenizer's eos), as generate does without --ignore-eos.
    progress: a tqdm-like bar, updated by roots."""
    policy = policy_for(policy)
    choose = budget if callable(budget) else None
    if choose is not None and max_budget is None:
        raise UserError("a budget function needs max_budget: the node count of the trees it prunes")
    build_budget = max_budget if choose is not None else budget
    check_replayable(rec, policy, build_budget)
    build_budget = int(build_budget)  # a static argument of the jitted build
    n_new = rec.max_new_tokens if max_new_tokens is None else max_new_tokens
    if not 1 <= n_new <= rec.max_new_tokens:
        raise UserError(f"max_new_tokens must be in 1..{rec.max_new_tokens} (the record's); got {n_new}")
    accepted, nodes = root_acceptance(rec, policy, build_budget, choose, progress=progress)
    stops = set(rec.stop_ids) if stop else set()
    prompts = [_hop(rec.outputs[b], accepted[b], nodes[b], n_new, stops) for b in range(rec.num_prompts)]
    return ReplayResult(policy.spec, "auto" if choose is not None else build_budget, rec.depth, prompts)


def _hop(outputs: np.ndarray, accepted: np.ndarray, nodes: np.ndarray, max_new: int, stops: set[int]) -> PromptReplay:
    """The rounds of one prompt: from output 0 (the prefill's token), a round at root j commits
    accepted[j] + 1 tokens; engine.commit_stage's stop rules."""
    lengths, verified = [], []
    if outputs[0] in stops:
        return PromptReplay(lengths, verified)
    j, out_len = 0, 1
    while out_len < max_new:
        n = int(accepted[j]) + 1
        lengths.append(n)
        verified.append(int(nodes[j]))
        if stops and not stops.isdisjoint(outputs[j + 1:j + 1 + n].tolist()):
            break
        out_len += n
        j += n
    return PromptReplay(lengths, verified)


def root_acceptance(rec: Record, policy: TreePolicy, budget: int, choose: Callable | None = None, *,
                    progress=None) -> tuple[np.ndarray, np.ndarray]:
    """(accepted draft nodes, verified nodes) of the round rooted at every recorded root, int32
    [P, N - 1] each: the policy's tree at `budget` (pruned per root by `choose`, see `replay`)
    walked along the greedy sequence."""
    p, roots, depth, k = rec.logp.shape
    total = p * roots
    logp = rec.logp.reshape(total, depth, k)
    ids = rec.ids.reshape(total, depth, k)
    # the greedy tokens at depths 1..D below root j: outputs j + 1 .. j + D
    follow = np.lib.stride_tricks.sliding_window_view(rec.outputs, depth, axis=1)[:, 1:roots + 1]
    follow = follow.reshape(total, depth)
    slots = policy.num_nodes(budget, depth) + 1
    # at least CALLS_IN_FLIGHT calls, so that XLA:CPU runs them side by side
    chunk = int(max(1, min(CALL_SLOTS // slots, -(-total // CALLS_IN_FLIGHT))))
    accepted = np.zeros(total, np.int32)
    verified = np.zeros(total, np.int32)
    pending: list = []

    def collect():
        lo, n, acc, ver = pending.pop(0)
        accepted[lo:lo + n], verified[lo:lo + n] = np.asarray(acc)[:n], np.asarray(ver)[:n]
        if progress is not None:
            progress.update(n)

    for lo in range(0, total, chunk):
        take = np.arange(lo, lo + chunk).clip(max=total - 1)  # the last call padded: one shape
        args = jax.device_put((logp[take], ids[take].astype(np.int32), follow[take]))
        keep = None
        if choose is not None:
            path_logp = np.asarray(_path_logp(args[0], policy=policy, budget=budget))
            keep = np.clip(np.asarray(choose(path_logp)).astype(np.int32).reshape(-1), 0, slots - 1)
            if keep.shape != (chunk,):
                raise UserError(f"the budget function returned {keep.size} counts for {chunk} trees; it must "
                                "return one count a tree")
            keep = jnp.asarray(keep)
        pending.append((lo, min(chunk, total - lo), *_walk_trees(*args, keep, policy=policy, budget=budget)))
        if len(pending) == CALLS_IN_FLIGHT:  # dispatch is asynchronous: the next call is queued behind
            collect()
    while pending:
        collect()
    return accepted.reshape(p, roots), verified.reshape(p, roots)


def _at_nodes(x, tree):
    """x [R, D, K] (per depth and rank) at every slot's depth and rank: [R, N + 1]."""
    r, d, k = x.shape
    flat = (tree.depths - 1).clip(0, d - 1) * k + tree.tokens
    return jnp.take_along_axis(x.reshape(r, d * k), flat, axis=1)


def _down_the_tree(tree, x, step, depth: int):
    """x [R, N + 1] folded from the root down each slot's path: y[i] = step(x[i], y[parent[i]]).
    By parent pointers (slots are topological): the policy's ancestor mask goes unused, and XLA
    drops it (on the CPU, DDTree-256's mask is bf16 products that took most of a replay)."""
    parent = tree.parents.clip(0)
    y = x
    for _ in range(depth):
        y = step(x, jnp.take_along_axis(y, parent, axis=1))
    return y


@functools.partial(jax.jit, static_argnames=("policy", "budget"))
def _path_logp(logp, *, policy: TreePolicy, budget: int):
    """Each slot's root-path log-prob [R, N], -inf at padding slots: the sum of its nodes' log-probs
    from depth 1 down, which is the score DDTree ranks by, to the bit."""
    tree = policy.build(logp, budget)
    node = jnp.where(tree.valid, _at_nodes(logp, tree), 0.0).at[:, 0].set(0.0)
    path = _down_the_tree(tree, node, lambda own, above: above + own, logp.shape[1])
    return jnp.where(tree.valid, path, -jnp.inf)[:, 1:]


@functools.partial(jax.jit, static_argnames=("policy", "budget"))
def _walk_trees(logp, ids, follow, keep=None, *, policy: TreePolicy, budget: int):
    """(accepted nodes, verified nodes) [R] of each root's tree walked along `follow` (the greedy
    tokens at depths 1..D after the root [R, D]); keep [R]: only the first keep slots (None: all).
    The walk's rule (ddtree_jax.walk): a node is accepted where it and every node above it carry
    the greedy token of their depth."""
    tree = policy.build(logp, budget)
    depth = logp.shape[1]
    valid = tree.valid
    if keep is not None:
        valid = valid & (jnp.arange(valid.shape[1])[None] <= keep[:, None])
    want = jnp.take_along_axis(follow, (tree.depths - 1).clip(0, depth - 1), axis=1)
    hit = (valid & (_at_nodes(ids, tree) == want)).at[:, 0].set(True)  # ranks -> token ids: the record's
    accepted = _down_the_tree(tree, hit, jnp.logical_and, depth)
    return jnp.max(jnp.where(accepted, tree.depths, 0), axis=1), valid[:, 1:].sum(-1, dtype=jnp.int32)
