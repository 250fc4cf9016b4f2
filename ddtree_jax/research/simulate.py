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

The prompts run in lockstep, as the engine runs a batch: each step builds the trees of the
current roots of the prompts still running (one jitted call per ROWS_PER_CALL of them, padded to
that size: one compile), walks them, and commits. A budget may be chosen per round for a whole
batch of rows (`BatchBudget`, the engine's `--budget auto`): `replay(..., batch=b)` groups the
prompts in consecutive batches of b whose choice reads their active rows together. Sampling
(temperature > 0) is not replayed: acceptance there depends on the target's distributions off
the greedy path, which a record does not hold.

Exactness against the engine needs K (the record's top-K) to cover every rank a policy reads:
`ranks_needed`. The numbers are float32 engine numbers: the record's batched drafter pass and
the engine's per-round pass round differently in the last bits, which changes a tree only where
two candidates tie to ~1e-7 (tests/test_research.py compares them round for round).
"""
from __future__ import annotations

import abc
import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.cost import Candidate, CostLines, CostModel, auto_lines, chain_path_logp, choose_budget_np
from ddtree_jax.errors import UserError
from ddtree_jax.research.store import Record
from ddtree_jax.trees import TreePolicy, make_policy
from ddtree_jax.trees.beam import BeamPolicy
from ddtree_jax.trees.chain import ChainPolicy
from ddtree_jax.trees.ddtree import DDTreePolicy
from ddtree_jax.trees.static import StaticPolicy
from ddtree_jax.tuning import tuning_for


class BatchBudget(abc.ABC):
    """A budget chosen once a round for a whole batch of rows, as the engine's `--budget auto`
    chooses one verify shape a round: a candidate is a DDTree node count n (the replayed policy's
    tree at the largest, cut to its first n slots) or "dflash" (the drafter's top-1 chain)."""

    @abc.abstractmethod
    def candidates(self, batch: int) -> tuple[Candidate, ...]:
        """What a batch of `batch` rows may be given (static for a replay: its largest node count
        sizes the trees built)."""

    @abc.abstractmethod
    def choose(self, path_logp: np.ndarray, chain_logp: np.ndarray | None, active: np.ndarray,
               prefix: np.float32) -> int:
        """The index into candidates(batch) of this round's pick. path_logp float32 [batch, N]: each
        row's largest tree's path log-probs in slot order (-inf at padding slots and at inactive
        rows); chain_logp float32 [batch, D]: the chain's (None unless "dflash" is a candidate);
        active bool [batch]: the rows still generating; prefix: their mean length (prompt +
        outputs before the root), float32 as the engine computes it."""

    def round_ms(self, candidate: Candidate, batch: int, prefix: np.float32) -> float | None:
        """The modelled ms of a round of `candidate` (None: not modelled); reported, never chosen by."""
        return None


@dataclasses.dataclass(frozen=True)
class AutoBudget(BatchBudget):
    """The engine's `--budget auto` over a cost model: each round the candidate ("dflash" where
    the model covers it, and the DDTree budgets `budgets` it covers) with the most expected tokens
    a millisecond summed over the active rows, at the model's costs for the batch's size after
    `prefix` tokens (None: the active rows' mean length, as the engine)."""

    model: CostModel
    budgets: tuple[int, ...]
    prefix: float | None = None

    def lines(self, batch: int) -> CostLines:
        lines = _auto_lines(self.model, self.budgets, batch)
        if lines is None:
            raise UserError(f"the cost model covers none of DFlash and budgets {', '.join(map(str, self.budgets))} "
                            f"at batch {batch} ({self.model.describe(one_line=True)}); pick a batch it covers (the "
                            "last batch holds the prompts left over: its size counts too)")
        return lines

    def candidates(self, batch: int) -> tuple[Candidate, ...]:
        return self.lines(batch).candidates

    def _at(self, prefix) -> np.float32:
        return prefix if self.prefix is None else np.float32(self.prefix)

    def choose(self, path_logp, chain_logp, active, prefix) -> int:
        lines = self.lines(len(active))
        # the engine's chooser, in numpy: slot order is the order its nodes are cut in
        return int(choose_budget_np(path_logp, lines.candidates, lines.at(self._at(prefix), xp=np), active,
                                    chain_logp=chain_logp, presorted=True))

    def round_ms(self, candidate, batch, prefix) -> float:
        lines = self.lines(batch)
        return float(lines.at(self._at(prefix), xp=np)[lines.candidates.index(candidate)])


@functools.lru_cache(maxsize=64)
def _auto_lines(model: CostModel, budgets: tuple[int, ...], batch: int) -> CostLines | None:
    return auto_lines(model, ("dflash", *budgets), batch)


def auto_budget(model: CostModel, budgets: Sequence[int] | None = None, *, prefix: float | None = None) -> AutoBudget:
    """`--budget auto` of `Generator(budget="auto", cost_model=model, auto_budgets=budgets)` as a
    replay budget (default budgets: the Generator's); prefix: the length its costs are read at
    (None: each round's, as the engine)."""
    if budgets is None:
        from ddtree_jax.generator import AUTO_BUDGETS

        budgets = AUTO_BUDGETS
    if not budgets or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in budgets):
        raise UserError(f"auto budgets must be DDTree budgets >= 1 (got {list(budgets)})")
    return AutoBudget(model, tuple(sorted({int(b) for b in budgets})), prefix)


# A budget: a node count; a function of the path log-probs [R, N] (slot order; -inf at padding
# slots) of a round's trees that returns how many of their first slots to keep, int [R] in 0..N,
# each row on its own; or a BatchBudget, one choice a round for a batch of rows.
Budget = int | Callable[[np.ndarray], np.ndarray] | BatchBudget
# Roots one jitted call takes: a step's rows go in calls of this many, the last padded (one
# compile). Small calls pad few rows as prompts finish and a step's calls run side by side: on 2
# CPU cores 4-8 rows a call replayed DDTree-256 fastest (32 prompts x 256 tokens).
ROWS_PER_CALL = 8


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
    picks: list[Candidate] = dataclasses.field(default_factory=list)  # a BatchBudget's choice each round
    round_ms: list[float] = dataclasses.field(default_factory=list)  # its modelled ms each round, where modelled

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
    batch: int = 1  # prompts run in lockstep, a BatchBudget's choice shared

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

    @property
    def choices(self) -> dict[Candidate, float]:
        """A BatchBudget's share of the rows' rounds at each candidate ({} for other budgets),
        pooled as mean_acceptance is."""
        picks = [c for p in self.prompts for c in p.picks]
        order = sorted(set(picks), key=lambda c: (c != "dflash", 0 if c == "dflash" else c))
        return {c: picks.count(c) / len(picks) for c in order}

    @property
    def mean_round_ms(self) -> float | None:
        """The modelled ms a round, over the rows' rounds (None where no round was modelled)."""
        ms = [m for p in self.prompts for m in p.round_ms]
        return float(np.mean(ms)) if ms else None

    def to_json(self) -> dict:
        out = {"policy": self.policy, "budget": self.budget, "batch": self.batch, "rounds": self.rounds,
               "mean_acceptance": self.mean_acceptance, "mean_nodes": self.mean_nodes, "histogram": self.histogram,
               "prompts": [{"rounds": p.rounds, "mean_acceptance": p.mean_acceptance,
                            "acceptance_lengths": p.acceptance_lengths} for p in self.prompts]}
        if self.choices:
            out.update(choices={str(c): s for c, s in self.choices.items()}, mean_round_ms=self.mean_round_ms)
        return out


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
           batch: int = 1, max_new_tokens: int | None = None, stop: bool = True, progress=None) -> ReplayResult:
    """Score `policy` over the record's prompts as the engine's greedy rounds would.

    budget: the nodes a round verifies (an int, as `--budget`); a function that picks them per
    row and round: it gets the path log-probs of each active row's tree at `max_budget` nodes
    (float32 [R, N], the sum of the drafter's log-probs along each node's root path, in slot
    order, -inf at padding slots) and returns how many of the first slots to keep (int [R],
    0..N); or a `BatchBudget` (`auto_budget`: the engine's `--budget auto`), one choice a round
    for each batch. Slots are in the policy's order (best first for ddtree and beam), so the kept
    slots are again a tree: the policy's tree at that budget, for ddtree. max_budget: the tree the
    function prunes (required with a function). batch: prompts decoded together, consecutive, as
    `generate --batch-size` (only a BatchBudget's choice depends on it). max_new_tokens: at most
    the record's (default). stop: end a prompt at the record's stop ids (its tokenizer's eos), as
    generate does without --ignore-eos. progress: a tqdm-like bar, updated by output tokens (each
    prompt's total is max_new_tokens)."""
    policy = policy_for(policy)
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise UserError(f"batch must be an int >= 1 (got {batch!r})")
    sizes = sorted({min(batch, rec.num_prompts - g) for g in range(0, rec.num_prompts, batch)})
    chain = False
    if isinstance(budget, BatchBudget):
        cands = {c for b in sizes for c in budget.candidates(b)}
        chain = "dflash" in cands
        build_budget = max((c for c in cands if c != "dflash"), default=0)
    elif callable(budget):
        if max_budget is None:
            raise UserError("a budget function needs max_budget: the node count of the trees it prunes")
        build_budget = max_budget
    else:
        build_budget = budget
    if build_budget or not chain:
        check_replayable(rec, policy, build_budget)
    build_budget = int(build_budget)  # a static argument of the jitted build
    n_new = rec.max_new_tokens if max_new_tokens is None else max_new_tokens
    if not 1 <= n_new <= rec.max_new_tokens:
        raise UserError(f"max_new_tokens must be in 1..{rec.max_new_tokens} (the record's); got {n_new}")
    prompts = _lockstep(rec, policy, build_budget, budget, chain, batch, n_new, set(rec.stop_ids) if stop else set(),
                        progress)
    return ReplayResult(policy.spec, build_budget if isinstance(budget, (int, np.integer)) else "auto", rec.depth,
                        prompts, batch)


def _lockstep(rec: Record, policy: TreePolicy, build_budget: int, budget: Budget, chain: bool, batch: int,
              max_new: int, stops: set[int], progress) -> list[PromptReplay]:
    """Every prompt's rounds, all prompts a step at a time: from output 0 (the prefill's token), a
    round at root j commits accepted + 1 tokens; engine.commit_stage's stop rules."""
    p, depth = rec.num_prompts, rec.depth
    prompt_lens = np.asarray([len(x) for x in rec.prompts], np.int64)
    out = [PromptReplay([], []) for _ in range(p)]
    root = np.zeros(p, np.int64)  # the root's output index; outputs so far = root + 1
    done = np.asarray([max_new <= 1 or int(o) in stops for o in rec.outputs[:, 0]])
    if progress is not None:
        progress.update(int(done.sum()) * max_new)
    need_path = bool(build_budget) and (callable(budget) or isinstance(budget, BatchBudget))
    slots = policy.num_nodes(build_budget, depth) if build_budget else 0
    while not done.all():
        rows = np.flatnonzero(~done)
        got = _trees_at(rec, policy, build_budget, chain, need_path, rows, root[rows])
        n_keep = np.full(len(rows), slots)
        pick = [None] * len(rows)
        ms = [None] * len(rows)
        if isinstance(budget, BatchBudget):
            at = {r: i for i, r in enumerate(rows)}
            for g in range(0, p, batch):
                group = np.arange(g, min(g + batch, p))
                active = ~done[group]
                if not active.any():
                    continue
                mine = np.asarray([at[r] for r in group[active]])
                path = np.full((len(group), slots), -np.inf, np.float32)
                if need_path:
                    path[active] = got["path_logp"][mine]
                chain_logp = None
                if chain:
                    chain_logp = np.full((len(group), depth), -np.inf, np.float32)
                    chain_logp[active] = got["chain_logp"][mine]
                lengths = (prompt_lens[group] + root[group])[active]
                # the engine's prefix: an int32 sum over the active rows / their count, in float32
                prefix = np.float32(lengths.sum()) / np.float32(len(lengths))
                cand = budget.candidates(len(group))[budget.choose(path, chain_logp, active, prefix)]
                cost = budget.round_ms(cand, len(group), prefix)
                for i in mine:
                    pick[i], ms[i] = cand, cost
                    n_keep[i] = -1 if cand == "dflash" else min(int(cand), slots)
        elif callable(budget):
            keep = np.asarray(budget(got["path_logp"])).astype(np.int64).reshape(-1)
            if keep.shape != (len(rows),):
                raise UserError(f"the budget function returned {keep.size} counts for {len(rows)} trees; it must "
                                "return one count a tree")
            n_keep = np.clip(keep, 0, slots)
        for i, r in enumerate(rows):
            k = n_keep[i]
            accepted, verified = ((got["chain_accepted"][i], got["chain_verified"][i]) if k < 0 else
                                  (got["accepted"][i, k], got["verified"][i, k]))
            n = int(accepted) + 1
            rounds = out[r]
            rounds.acceptance_lengths.append(n)
            rounds.nodes.append(int(verified))
            if pick[i] is not None:
                rounds.picks.append(pick[i])
                if ms[i] is not None:
                    rounds.round_ms.append(ms[i])
            j = root[r]
            was = j + 1
            if stops and not stops.isdisjoint(rec.outputs[r, j + 1:j + 1 + n].tolist()):
                done[r] = True
            root[r] = j + n
            if root[r] + 1 >= max_new:
                done[r] = True
            if progress is not None:
                progress.update(max_new - was if done[r] else n)
    return out


def _trees_at(rec: Record, policy: TreePolicy, budget: int, chain: bool, need_path: bool, rows: np.ndarray,
              roots: np.ndarray) -> dict[str, np.ndarray]:
    """The rounds rooted at output roots[i] of prompt rows[i], in calls of ROWS_PER_CALL roots
    (all dispatched before any is read): see `_walk_trees`."""
    follow = np.lib.stride_tricks.sliding_window_view(rec.outputs, rec.depth, axis=1)  # outputs j + 1 .. j + D
    calls = []
    for lo in range(0, len(rows), ROWS_PER_CALL):
        take = np.arange(lo, lo + ROWS_PER_CALL).clip(max=len(rows) - 1)  # the last call padded: one shape
        r, j = rows[take], roots[take]
        args = jax.device_put((rec.logp[r, j], rec.ids[r, j].astype(np.int32), follow[r, j + 1]))
        calls.append(_walk_trees(*args, policy=policy, budget=budget, chain=chain, path=need_path))
    return {k: np.concatenate([np.asarray(c[k]) for c in calls])[:len(rows)] for k in calls[0]}


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


@functools.partial(jax.jit, static_argnames=("policy", "budget", "chain", "path"))
def _walk_trees(logp, ids, follow, *, policy: TreePolicy, budget: int, chain: bool, path: bool):
    """Each root's tree at `budget` walked along `follow` (the greedy tokens at depths 1..D after
    the root [R, D]), for every cut of it at once: accepted [R, N + 1] (the accepted nodes of its
    first n slots at column n: a node's ancestors come before it, so a cut keeps or drops its
    path whole) and verified [R, N + 1] (the valid nodes among them). path: also path_logp
    [R, N], each slot's root-path log-prob (-inf at padding slots: the sum of its nodes' log-probs
    from depth 1 down, which is the score DDTree ranks by, to the bit). chain: also the drafter's
    top-1 chain's chain_accepted and chain_verified [R], and chain_logp [R, D] (DFlash's tree).
    The walk's rule (ddtree_jax.walk): a node is accepted where it and every node above it carry
    the greedy token of their depth."""
    out = {}
    trees = [("", policy, budget)] if budget else []
    if chain:
        trees.append(("chain_", make_policy("chain").with_tuning(policy.tuning), logp.shape[1]))
        out["chain_logp"] = chain_path_logp(logp[..., :1])  # the top-1 per depth: ranks are by value
    for name, pol, b in trees:
        tree = pol.build(logp, b)
        depth = logp.shape[1]
        want = jnp.take_along_axis(follow, (tree.depths - 1).clip(0, depth - 1), axis=1)
        hit = (tree.valid & (_at_nodes(ids, tree) == want)).at[:, 0].set(True)  # ranks -> token ids: the record's
        accepted = jax.lax.cummax(jnp.where(_down_the_tree(tree, hit, jnp.logical_and, depth), tree.depths, 0), axis=1)
        verified = jnp.cumsum(tree.valid.at[:, 0].set(False), axis=1, dtype=jnp.int32)
        if name:
            out[name + "accepted"], out[name + "verified"] = accepted[:, -1], verified[:, -1]
            continue
        out["accepted"], out["verified"] = accepted, verified
        if path:
            node = jnp.where(tree.valid, _at_nodes(logp, tree), 0.0).at[:, 0].set(0.0)
            above = _down_the_tree(tree, node, lambda own, above: above + own, depth)
            out["path_logp"] = jnp.where(tree.valid, above, -jnp.inf)[:, 1:]
    return out
