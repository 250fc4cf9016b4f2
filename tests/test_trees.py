"""Tree policies: structural validity for every registered policy, and exact agreement of
`ddtree` with the classic heap best-first search, `beam` with a plain beam search, `chain` with
the top-1 path and `static` with its rank paths.

Shapes are drawn from a fixed list of cases so that each (policy, shape) compiles once; the data
is drawn freely. `DDTREE_FUZZ_EXAMPLES=5000 pytest tests/test_trees.py` runs a long fuzz.
"""
from __future__ import annotations

import dataclasses
import functools
import heapq
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import FAST_COMPILE

from ddtree_jax.trees import DraftTree, TreePolicy, available_policies, make_policy, register_policy, tree_from_nodes
from ddtree_jax.trees import base as trees_base
from ddtree_jax.trees import ddtree
from ddtree_jax.trees.static import parse_static_tree
from ddtree_jax.tuning import GPU_TREE, TreeTuning, VocabTopK

CPU_TREE = TreeTuning()

EXAMPLES = int(os.environ.get("DDTREE_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# (batch, depth D, vocab V, budget): edges (D=1, V=2, budget 1, budget > distinct paths) and
# realistic sizes.
CASES = [
    (1, 1, 2, 1),
    (6, 1, 50, 70),
    (6, 3, 2, 70),
    (6, 3, 3, 9),
    (6, 4, 3, 10),
    (6, 8, 50, 70),
    (6, 8, 5, 33),
    (6, 5, 17, 16),
    (6, 2, 50, 7),
]
# Large budgets: candidate lists past ddtree's rank-by-count limit go through its sort branch.
LARGE_CASES = [(2, 5, 3000, 1100), (1, 15, 400, 300)]
STATIC_TREES = ["0", "0;1;2;0.0;0.1;1.0;0.0.0;0.0.0.0", "0;0.0;0.0.0;1;0.0.0.0;0.0.0.0.0;0.0.0.0.0.0;0.0.0.0.0.0.0;0.0.0.0.0.0.0.0"]
SPECS = ["ddtree", "chain", "beam:width=1", "beam:width=4"] + [f"static:tree={t}" for t in STATIC_TREES]
# Value kinds: continuous log-softmax; quantized logits (exact ties within a depth); dyadic
# log-probs (exact float32 sums: ties across depths and paths, and zero log-probs).
KINDS = ["float", "ties", "dyadic"]


def make_logp(kind: str, shape: tuple[int, int, int], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "float":
        logits = rng.normal(size=shape) * rng.uniform(0.3, 4.0)
    elif kind == "ties":
        logits = rng.integers(0, 3, size=shape).astype(np.float64)
    else:
        return (-rng.integers(0, 6, size=shape) / 4.0).astype(np.float32)
    return np.asarray(jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1))




@functools.lru_cache(maxsize=None)
def compiled_build(spec: str, shape: tuple[int, ...], dtype: str, budget: int, tuning: TreeTuning = CPU_TREE):
    policy = make_policy(spec).with_tuning(tuning)
    lowered = jax.jit(policy.build, static_argnums=1).lower(jax.ShapeDtypeStruct(shape, dtype), budget)
    return lowered.compile(compiler_options=FAST_COMPILE)


def build_tree(spec: str, logp, budget: int, tuning: TreeTuning = CPU_TREE) -> DraftTree:
    logp = jnp.asarray(logp)
    return compiled_build(spec, logp.shape, str(logp.dtype), budget, tuning)(logp)


def build(spec: str, logp, budget: int, tuning: TreeTuning = CPU_TREE) -> dict[str, np.ndarray]:
    tree = build_tree(spec, logp, budget, tuning)
    return {f.name: np.asarray(getattr(tree, f.name)) for f in dataclasses.fields(tree)}


def static_ok(spec: str, depth: int, vocab: int, budget: int) -> bool:
    if not spec.startswith("static:"):
        return True
    paths = parse_static_tree(spec.partition("=")[2])[:budget]
    return all(len(p) <= depth and max(p) < vocab for p in paths)


# ----------------------------------------------------------------------------- references


def ranked(logp_row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per depth: tokens by rank (ties: lower token id first) and their log-probs."""
    order = np.argsort(-logp_row, axis=-1, kind="stable")
    return order, np.take_along_axis(logp_row, order, axis=-1)


def heap_best_first(logp_row: np.ndarray, budget: int) -> list[tuple[tuple[int, ...], np.float32]]:
    """Classic best-first search: pop the best path, push its next sibling and its first child.
    Order: higher score, then lower depth, then the node whose parent was popped first, then the
    lower last rank (the heap key (-score, depth, parent's pop index, rank)). Scores are float32
    sums from depth 1 down, like the implementation's."""
    depth, vocab = logp_row.shape
    _, vals = ranked(logp_row)
    zero = np.float32(0)
    heap = [(-float(vals[0, 0]), 1, -1, 0, (0,), zero, vals[0, 0])]
    out = []
    while heap and len(out) < budget:
        _, d, parent, r, path, parent_score, score = heapq.heappop(heap)
        me = len(out)
        out.append((path, score))
        if r + 1 < vocab:
            s = np.float32(parent_score + vals[d - 1, r + 1])
            heapq.heappush(heap, (-float(s), d, parent, r + 1, path[:-1] + (r + 1,), parent_score, s))
        if d < depth:
            s = np.float32(score + vals[d, 0])
            heapq.heappush(heap, (-float(s), d + 1, me, 0, path + (0,), score, s))
    return out


def plain_beam(logp_row: np.ndarray, width: int, budget: int) -> list[tuple[int, ...]]:
    """Beam search of `width` per depth, union of beams, best `budget` under DDTree's order: each
    depth's candidates listed by (beam position, rank) and sorted stably by score, the union
    sorted stably by (score, depth)."""
    depth, vocab = logp_row.shape
    _, vals = ranked(logp_row)
    beam = [((), np.float32(0))]
    nodes = []
    for d in range(depth):
        cand = [(p + (r,), np.float32(s + vals[d, r])) for p, s in beam for r in range(vocab)]
        cand.sort(key=lambda c: -float(c[1]))
        beam = cand[:width]
        nodes += beam
    nodes.sort(key=lambda c: (-float(c[1]), len(c[0])))
    return [p for p, _ in nodes[:budget]]


def rank_paths(tree: dict[str, np.ndarray], b: int, logp_row: np.ndarray) -> list[tuple[int, ...]]:
    """Rank path of every valid slot, read from the tokens (slot order)."""
    order, _ = ranked(logp_row)
    rank_of = np.argsort(order, axis=-1)  # [D, V]: token -> rank
    paths: dict[int, tuple[int, ...]] = {0: ()}
    out = []
    for i in range(1, tree["tokens"].shape[1]):
        if not tree["valid"][b, i]:
            continue
        d = tree["depths"][b, i]
        paths[i] = paths[int(tree["parents"][b, i])] + (int(rank_of[d - 1, tree["tokens"][b, i]]),)
        out.append(paths[i])
    return out


def path_score64(logp_row: np.ndarray, path: tuple[int, ...]) -> float:
    _, vals = ranked(logp_row)
    return float(sum(np.float64(vals[d, r]) for d, r in enumerate(path)))


# ----------------------------------------------------------------------------- validity


def check_valid_tree(tree: dict[str, np.ndarray], num_nodes: int, depth: int, budget: int) -> None:
    tokens, parents, depths, valid, mask = (tree[k] for k in ("tokens", "parents", "depths", "valid", "ancestor_mask"))
    batch = tokens.shape[0]
    slots = num_nodes + 1
    assert tokens.shape == parents.shape == depths.shape == valid.shape == (batch, slots)
    assert mask.shape == (batch, slots, slots)
    assert tokens.dtype == parents.dtype == depths.dtype == np.int32
    assert valid.dtype == mask.dtype == np.bool_
    assert num_nodes <= budget
    assert (parents[:, 0] == -1).all() and (depths[:, 0] == 0).all() and valid[:, 0].all()
    for b in range(batch):
        closure = np.zeros((slots, slots), bool)
        closure[0, 0] = True
        children: dict[int, list[int]] = {}
        for i in range(1, slots):
            p = parents[b, i]
            assert 0 <= p < i, f"slot {i}: parent {p} not before it"
            if valid[b, i]:
                assert valid[b, p], f"slot {i}: valid node under invalid parent"
                assert depths[b, i] == depths[b, p] + 1
                assert 1 <= depths[b, i] <= depth
                children.setdefault(int(p), []).append(int(tokens[b, i]))
            else:
                assert (p, depths[b, i], tokens[b, i]) == (0, 1, 0), f"slot {i}: bad invalid-node padding"
            closure[i] = closure[p]
            closure[i, i] = True
        np.testing.assert_array_equal(mask[b], closure)
        for p, toks in children.items():
            assert len(set(toks)) == len(toks), f"children of slot {p} repeat a token: {toks}"


@FUZZ
@given(spec=st.sampled_from(SPECS), case=st.sampled_from(CASES), kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1))
def test_every_policy_builds_a_valid_tree(spec, case, kind, seed):
    batch, depth, vocab, budget = case
    if not static_ok(spec, depth, vocab, budget):
        return
    policy = make_policy(spec)
    logp = make_logp(kind, (batch, depth, vocab), seed)
    tree = build(spec, logp, budget)
    n = policy.num_nodes(budget, depth)
    check_valid_tree(tree, n, depth, budget)
    for b in range(batch):
        paths = rank_paths(tree, b, logp[b])
        if spec == "ddtree":
            want = heap_best_first(logp[b], budget)
            assert n == budget
            assert_same_best_first(paths, want, logp[b], exact=kind == "dyadic")
        elif spec == "chain":
            assert n == min(budget, depth) and tree["valid"][b].all()
            assert paths == [(0,) * d for d in range(1, n + 1)]
        elif spec.startswith("beam:"):
            assert paths == plain_beam(logp[b], policy.width, budget)
        else:
            assert paths == list(policy.paths[:n])
            assert tree["valid"][b].all()


@FUZZ
@given(case=st.sampled_from(CASES), kind=st.sampled_from(KINDS), seed=st.integers(0, 2**32 - 1))
def test_ddtree_equals_heap_best_first(case, kind, seed):
    check_ddtree_against_heap(case, kind, seed)


@pytest.mark.parametrize("count_limit", [0, 1024])
@pytest.mark.parametrize("case", LARGE_CASES + CASES[5:7])
@pytest.mark.parametrize("kind", ["ties", "dyadic"])
def test_ddtree_equals_heap_both_selection_branches(case, kind, count_limit):
    """Selections by pairwise rank counting (the GPU's for short lists) and by sort agree with the heap."""
    check_ddtree_against_heap(case, kind, seed=sum(case) * 7 + len(kind) + count_limit,
                              tuning=TreeTuning(rank_by_count_max=count_limit))


@pytest.mark.parametrize("count_limit", [0, 4096])
def test_ddtree_select_barrier_keeps_the_tree(count_limit):
    """TreeTuning.select_barrier (each selection's inputs materialized) changes the program, not
    the tree: with it on, both selection branches still build the heap's tree."""
    check_ddtree_against_heap((2, 6, 300, 64), "ties", seed=5 + count_limit,
                              tuning=TreeTuning(select_barrier=True, rank_by_count_max=count_limit))


@pytest.mark.parametrize("case,kind", [((2, 6, 300, 64), "ties"), ((3, 8, 50, 70), "dyadic"),
                                       ((2, 5, 40, 16), "float"), ((1, 15, 400, 300), "ties")])
def test_ddtree_one_hot_selection_keeps_the_tree(case, kind):
    """TreeTuning.select_onehot_max (a depth's selected values picked by one-hot reductions over
    the ranks instead of a scatter and gathers) builds the heap's tree. The largest case has
    selections on both sides of the limit (n * P from ~4k to ~90k candidates-slots)."""
    tuning = TreeTuning(rank_by_count_max=4096, select_onehot_max=1 << 30 if case[3] < 300 else 40000)
    check_ddtree_against_heap(case, kind, seed=sum(case) + len(kind), tuning=tuning)


def test_select_onehot_equals_gathering_at_select_best():
    """select_onehot's values are exactly the gathers at select_best's positions, ties included
    (equal scores, -0.0 and +0.0, -inf)."""
    rng = np.random.default_rng(7)
    scores = rng.integers(-3, 1, size=(3, 40)).astype(np.float32) / 2
    scores[0, :5] = -np.inf
    scores[1, 3] = -0.0
    keys = np.stack([rng.permutation(1000)[:40] for _ in range(3)]).astype(np.int32)
    extra = rng.integers(0, 99, size=(3, 40)).astype(np.int32)
    got = jax.jit(ddtree.select_onehot, static_argnums=2)(scores, keys, 17, extra)
    sel = np.asarray(jax.jit(ddtree.select_best, static_argnums=2)(scores, keys, 17))
    for g, x in zip(got, (scores, keys, extra)):
        want = np.take_along_axis(x, sel, axis=-1)
        np.testing.assert_array_equal(np.asarray(g), want)
        assert (np.signbit(np.asarray(g)) == np.signbit(want)).all()


def test_pairwise_rank_equals_the_sort_with_ties():
    """The counting branch (XLA's pairwise compare-and-sum) orders by (score desc, key asc) like
    the sort branch: -0.0 ties +0.0 and -inf ties -inf, both broken by the key."""
    s = jnp.asarray([[0.0, -np.inf, -0.0, 1.0, -np.inf, -0.0]], jnp.float32)
    k = jnp.asarray([[5, 2, 3, 9, 1, 4]], jnp.int32)
    np.testing.assert_array_equal(np.asarray(ddtree._rank(s, k)), [[3, 5, 1, 0, 4, 2]])
    rng = np.random.default_rng(6)
    scores = np.where(rng.random((3, 300)) < 0.4, -np.inf, np.round(rng.normal(size=(3, 300)) * 2) / 2)
    scores = jnp.asarray(scores, jnp.float32)
    keys = jnp.asarray(np.stack([rng.permutation(100_000)[:300] for _ in range(3)]), jnp.int32)
    # the sort branch, then the counting branch
    results = [np.asarray(ddtree.select_best(scores, keys, 40, TreeTuning(rank_by_count_max=limit)))
               for limit in (0, 4096)]
    np.testing.assert_array_equal(results[1], results[0])


def test_policies_take_a_tuning_that_is_no_option():
    """with_tuning gives the same policy with another TreeTuning: unequal (so jit compiles it
    anew), the same spec text; make_policy accepts no `tuning` option, and a TreeTuning checks
    its kernel mode."""
    for spec in SPECS:
        policy = make_policy(spec)
        tuned = policy.with_tuning(GPU_TREE)
        assert tuned.tuning is GPU_TREE and policy.tuning == TreeTuning() and type(tuned) is type(policy)
        assert tuned != policy and tuned.with_tuning(TreeTuning()) == policy
        assert hash(tuned.with_tuning(TreeTuning())) == hash(policy)
        assert tuned.spec == policy.spec and make_policy(tuned.spec) == policy
    assert make_policy("beam:width=3").with_tuning(GPU_TREE).width == 3
    with pytest.raises(ValueError, match="has no option 'tuning'; its options: width"):
        make_policy("beam:tuning=gpu")
    with pytest.raises(ValueError, match="TreeTuning.kernels='triton'; choose one of pallas, pallas_interpret"):
        TreeTuning(kernels="triton")


@pytest.mark.parametrize("kind", KINDS)
def test_ddtree_equals_heap_with_the_gpu_vocab_top_k(kind):
    """The GPU's two-stage vocabulary top-k keeping few candidates per chunk (both its fast path
    and its fallback: 'ties' and 'dyadic' concentrate equal values; its first stage in the
    threshold kernel, its second by lax.top_k) builds the heap's tree."""
    tuning = TreeTuning(vocab_topk=VocabTopK(chunks=16, keep=24, keep_from_k=100, stage2_select=False))
    check_ddtree_against_heap((1, 15, 400, 300), kind, seed=17, tuning=tuning)


def check_ddtree_against_heap(case, kind, seed, tuning: TreeTuning = CPU_TREE):
    """DDTree's tree, built with `tuning`, is the heap's."""
    batch, depth, vocab, budget = case
    logp = make_logp(kind, (batch, depth, vocab), seed)
    tree = build("ddtree", logp, budget, tuning)
    for b in range(batch):
        want = heap_best_first(logp[b], budget)
        assert_same_best_first(rank_paths(tree, b, logp[b]), want, logp[b], exact=kind == "dyadic")


def assert_same_best_first(paths, want, logp_row, exact: bool) -> None:
    """Same nodes in the same (best-first) slot order. For non-exact float inputs, a mismatch is
    tolerated only between nodes whose scores tie with the cut-off score up to float32 rounding
    (float32 sums can merge scores that differ in the last place, then the tie rule decides)."""
    want_paths = [p for p, _ in want]
    if paths == want_paths:
        return
    assert not exact, f"best-first mismatch:\n got  {paths}\n want {want_paths}"
    assert len(paths) == len(want_paths)
    cut = path_score64(logp_row, want_paths[-1])
    for p in set(paths) ^ set(want_paths):
        assert abs(path_score64(logp_row, p) - cut) <= 1e-5 * (1 + abs(cut)), f"{p} is not a near tie of the cut"


# ----------------------------------------------------------------------------- specific cases


@pytest.mark.parametrize("case", [(6, 8, 5, 3), (4, 15, 4, 6), (3, 15, 40, 14), (2, 6, 300, 64)])
@pytest.mark.parametrize("kind", KINDS)
def test_ddtree_global_pruning_keeps_the_tree(case, kind):
    """The exact tree's pruning by the global budget (ddtree._beam_bounds: beams of n - d + 1,
    candidates with (i+1)(r+2) <= n - d + 2, no depth past n) builds the heap's tree, budgets
    below the depth included ('dyadic' has zero log-probs: children tie with their parents)."""
    check_ddtree_against_heap(case, kind, seed=sum(case) * 3 + len(kind))


def test_beam_bounds():
    from ddtree_jax.trees.ddtree import _beam_bounds

    # the beam's own bound: (i+1)(r+1) <= width, all `width` kept
    beam, pairs = _beam_bounds(4, 3, 4, None, 5)
    assert beam == 4 and pairs == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (3, 0)]
    # the exact tree's: (i+1)(r+2) <= n - d + 2, n - d + 1 kept
    beam, pairs = _beam_bounds(8, 8, 8, 8, 2)
    assert beam == 7 and pairs == [(0, r) for r in range(7)] + [(1, 0), (1, 1), (1, 2), (2, 0), (3, 0)]
    assert _beam_bounds(2, 8, 8, 8, 8) == (1, [(0, 0)])       # depth n: the best chain only
    assert _beam_bounds(1, 8, 8, 8, 9) == (0, [])             # deeper than n: nothing
    assert [len(_beam_bounds(b, b, b, b, 2)[1]) for b in (16, 64, 256, 1024)] == [34, 216, 1210, 6238]


def test_ddtree_matches_heap_on_handmade_ties():
    # Depth 1: tokens 2 and 0 tie at the top; depth 2: token 1 has log-prob 0, so children tie
    # with their parents (lower depth first) and siblings tie (smaller rank path first).
    logp = np.full((1, 3, 4), -3.0, np.float32)
    logp[0, 0, [2, 0]] = -0.5
    logp[0, 1, 1] = 0.0
    logp[0, 2, [3, 1]] = -1.0
    for budget in (2, 5, 13, 70):
        tree = build("ddtree", logp, budget)
        check_valid_tree(tree, budget, 3, budget)
        want = [p for p, _ in heap_best_first(logp[0], budget)]
        assert rank_paths(tree, 0, logp[0]) == want
    tree = build("ddtree", logp, 5)
    # Best first: (0) and (1) tie at -0.5 (rank 0 is token 0: the lower id wins), then their
    # zero-cost children (0,0), (1,0) (deeper loses the tie), then (0,0,0) at -1.5.
    assert tree["tokens"][0, 1:].tolist() == [0, 2, 1, 1, 1]
    assert tree["depths"][0, 1:].tolist() == [1, 1, 2, 2, 3]


def test_ddtree_tie_goes_to_the_child_of_the_better_parent():
    # The 9th and 10th nodes tie at -1 with (0,1): (0,1) wins by depth, then (1,0,1) beats
    # (0,1,0) because its parent (1,0) (score -0.5) comes before (0,1) (score -1), although
    # (0,1,0) is the lexicographically smaller rank path.
    logp = np.array([[[-0.5, 0.0, -1.5], [0.0, -1.5, -1.0], [0.0, -0.5, -1.5]]], np.float32)
    tree = build("ddtree", logp, 10)
    want = [(0,), (0, 0), (0, 0, 0), (1,), (1, 0), (0, 0, 1), (1, 0, 0), (0, 1), (1, 0, 1), (0, 1, 0)]
    assert [p for p, _ in heap_best_first(logp[0], 10)] == want
    assert rank_paths(tree, 0, logp[0]) == want
    assert rank_paths(build("ddtree", logp, 9), 0, logp[0]) == want[:9]


def test_budget_beyond_distinct_paths_pads_invalid():
    logp = make_logp("float", (6, 3, 2), 0)
    tree = build("ddtree", logp, 70)
    assert tree["valid"].sum(axis=1).tolist() == [1 + 2 + 4 + 8] * 6
    assert not tree["valid"][:, 15:].any()


@pytest.mark.parametrize("spec", SPECS)
def test_budget_zero_is_root_only(spec):
    policy = make_policy(spec)
    assert policy.num_nodes(0, 4) == 0
    tree = policy.build(jnp.zeros((2, 4, 5)), 0)
    assert tree.tokens.shape == (2, 1) and tree.ancestor_mask.shape == (2, 1, 1)
    assert tree.parents.tolist() == [[-1], [-1]] and tree.valid.all()


def test_build_under_jit_with_static_budget_and_policy():
    logp = make_logp("float", (2, 5, 17), 1)

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def round_like(logp, policy: TreePolicy, budget: int):
        tree = policy.build(logp, budget).with_root_token(jnp.array([7, 9]))
        return tree, jnp.sum(tree.ancestor_mask)

    tree, _ = round_like(jnp.asarray(logp), make_policy("ddtree"), 33)
    assert tree.tokens[:, 0].tolist() == [7, 9]
    np.testing.assert_array_equal(tree.tokens[:, 1:], build("ddtree", logp, 33)["tokens"][:, 1:])
    with pytest.raises(ValueError, match="static int"):
        jax.jit(lambda x, b: make_policy("ddtree").build(x, b))(jnp.asarray(logp), 4)


def test_bf16_logp_is_accepted():
    logp = jnp.asarray(make_logp("float", (1, 3, 8), 2), jnp.bfloat16)
    tree = build_tree("ddtree", logp, 5)
    assert tree.tokens.dtype == jnp.int32 and tree.num_nodes == 5


def test_tree_is_a_pytree():
    tree = build_tree("chain", jnp.zeros((1, 3, 4)), 3)
    leaves = jax.tree_util.tree_leaves(tree)
    assert len(leaves) == 5
    again = jax.tree_util.tree_map(lambda x: x, tree)
    assert isinstance(again, DraftTree) and again.num_nodes == 3


def random_parents(rng: np.random.Generator, batch: int, slots: int, max_depth: int) -> np.ndarray:
    """Parent arrays of random trees whose depth is at most max_depth (some rows reach it)."""
    parents = np.full((batch, slots), -1, np.int32)
    for b in range(batch):
        depth = [0]
        chain = rng.random() < 0.5  # half the rows start with a path to max_depth, then anything
        for i in range(1, slots):
            if chain and i <= max_depth:
                p = i - 1
            else:
                p = int(rng.choice([j for j in range(i) if depth[j] < max_depth]))
            parents[b, i] = p
            depth.append(depth[p] + 1)
    return parents


@pytest.mark.parametrize("impl", trees_base.ANCESTOR_IMPLS)
@pytest.mark.parametrize("batch,slots,max_depth", [(1, 1, 0), (3, 2, 1), (4, 17, 3), (2, 65, 15), (2, 40, 40)])
def test_ancestor_mask_impls_equal_the_closure(impl, batch, slots, max_depth):
    """Both ancestor-mask constructions ("square": matmul squaring, "chain": parent pointers) give
    j == i or j an ancestor of i, for trees as deep as max_depth allows."""
    parents = random_parents(np.random.default_rng(slots * 31 + max_depth), batch, slots, max_depth)
    mask = np.asarray(jax.jit(trees_base.ancestor_mask_from_parents, static_argnums=(1, 2))(
        jnp.asarray(parents), max_depth, impl))
    for b in range(batch):
        closure = np.eye(slots, dtype=bool)
        for i in range(1, slots):
            closure[i] |= closure[parents[b, i]]
        np.testing.assert_array_equal(mask[b], closure)


def test_ancestor_chain_from_picks_the_construction_by_size():
    """TreeTuning.ancestor_chain_from is the slot count from which a tree build follows parent
    pointers instead of squaring; builds on either side are valid trees, and every policy builds
    its mask as its tuning says (no squaring's matmul when chained). An unknown impl is a one-line
    error."""
    tuning = TreeTuning(ancestor_chain_from=34)
    assert [trees_base.ancestor_impl(s, tuning) for s in (33, 34, 1025)] == ["square", "chain", "chain"]
    assert trees_base.ancestor_impl(1 << 20) == "square" and trees_base.ancestor_impl(65, GPU_TREE) == "chain"
    logp = jnp.asarray(make_logp("ties", (2, 6, 50), 3))
    for slots in (33, 41):
        impl = trees_base.ancestor_impl(slots, tuning)
        hlo = jax.jit(lambda p: trees_base.ancestor_mask_from_parents(p, 15, tuning=tuning)).lower(
            jnp.zeros((1, slots), jnp.int32)).as_text()
        assert ("dot_general" in hlo) == (impl == "square")
        check_valid_tree(build("ddtree", logp, slots - 1, tuning), slots - 1, 6, slots - 1)
    for spec in ("ddtree", "chain", "beam:width=2", f"static:tree={STATIC_TREES[1]}"):  # one of each class
        for chain_from in (0, TreeTuning().ancestor_chain_from):
            policy = make_policy(spec).with_tuning(TreeTuning(ancestor_chain_from=chain_from))
            hlo = jax.jit(lambda x: policy.build(x, 8)).lower(logp).as_text()
            assert ("dot_general" in hlo) == (chain_from > 0), spec
    with pytest.raises(ValueError, match="unknown ancestor-mask impl 'bits'"):
        trees_base.ancestor_mask_from_parents(jnp.zeros((1, 3), jnp.int32), 2, "bits")


# ----------------------------------------------------------------------------- registry and errors


def test_registry_lists_builtins_and_round_trips_specs():
    assert {"ddtree", "chain", "beam", "static"} <= set(available_policies())
    for spec in SPECS:
        policy = make_policy(spec)
        assert make_policy(policy.spec) == policy
        assert hash(make_policy(policy.spec)) == hash(policy)
    assert make_policy(" beam:width = 2 ").width == 2
    assert make_policy("beam").width == 4


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown tree policy 'nope'; available: beam, chain, ddtree, static"),
        ("", "empty tree policy spec"),
        ("beam:width", "malformed option 'width'"),
        ("beam:depth=3", "has no option 'depth'; its options: width"),
        ("beam:width=two", "must be an int; got 'two'"),
        ("beam:width=0", "beam width must be an int >= 1"),
        ("beam:width=2,width=3", "given twice"),
        ("static", "needs option\\(s\\) tree"),
        ("static:tree=", "empty static tree"),
        ("static:tree=0;x", "bad node 'x'"),
        ("static:tree=0;0..1", "bad node '0..1'"),
        ("static:tree=0;-1", "negative rank"),
        ("static:tree=0;0", "appears twice"),
        ("static:tree=0;1.0", "needs its parent '1' listed before it"),
        ("static:tree=0.0;0", "needs its parent '0' listed before it"),
    ],
)
def test_bad_specs_raise_one_line_value_errors(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        make_policy(spec)
    assert "\n" not in str(info.value)


def test_static_tree_checks_depth_and_vocab_at_build():
    policy = make_policy("static:tree=0;0.0;0.0.0")
    with pytest.raises(ValueError, match="deeper than the drafter's 2 positions"):
        policy.build(jnp.zeros((1, 2, 5)), 3)
    assert policy.build(jnp.zeros((1, 2, 5)), 2).num_nodes == 2  # the budget cut keeps it shallow
    with pytest.raises(ValueError, match="rank >= the vocabulary size 3"):
        make_policy("static:tree=0;3").build(jnp.zeros((1, 2, 3)), 2)


def test_a_new_policy_is_one_decorated_class():
    @register_policy("test_only_first_two")
    @dataclasses.dataclass(frozen=True)
    class FirstTwo(TreePolicy):
        """Two children of the root: the top-2 tokens at depth 1."""

        def num_nodes(self, budget, depth):
            return min(budget, 2, depth * 2)

        def build(self, logp, budget):
            logp = trees_base.check_logp(logp)
            n = self.num_nodes(budget, logp.shape[1])
            tokens = jax.lax.top_k(logp[:, 0], n)[1]
            zeros = jnp.zeros_like(tokens)
            return tree_from_nodes(tokens, zeros, zeros + 1, num_nodes=n, max_depth=logp.shape[1])

    try:
        assert "test_only_first_two" in available_policies()
        tree = make_policy("test_only_first_two").build(jnp.log(jnp.array([[[0.1, 0.6, 0.3]]])), 5)
        assert tree.tokens.tolist() == [[0, 1, 2]]
        check_valid_tree({f.name: np.asarray(getattr(tree, f.name)) for f in dataclasses.fields(tree)}, 2, 1, 5)
    finally:
        trees_base._REGISTRY.pop("test_only_first_two", None)


def test_the_documented_new_policy_works():
    """The example policy of `ddtree_jax.trees`' docstring (and the README) registers, parses its
    option and builds a valid tree, with the default tuning and with a device's (chained mask)."""
    import sys
    import textwrap
    import types

    import ddtree_jax.trees as trees

    doc = trees.__doc__
    code = textwrap.dedent(doc[doc.index("    # ddtree_jax/trees/mine.py"):doc.index("\nand nothing else")])
    assert len(code.splitlines()) <= 22
    module = sys.modules["test_only_mine"] = types.ModuleType("test_only_mine")
    try:
        exec(compile(code, "mine.py", "exec"), module.__dict__)
        logp = jnp.asarray(make_logp("float", (2, 5, 30), 1))
        for tuning in (TreeTuning(), dataclasses.replace(GPU_TREE, kernels="pallas_interpret", ancestor_chain_from=0)):
            policy = make_policy("mine:depth_cap=3").with_tuning(tuning)
            assert policy.spec == "mine:depth_cap=3" and policy.num_nodes(8, 5) == 3
            tree = policy.build(logp, 8)
            check_valid_tree({f.name: np.asarray(getattr(tree, f.name)) for f in dataclasses.fields(tree)}, 3, 5, 8)
            np.testing.assert_array_equal(tree.tokens[:, 1:], jnp.argmax(logp[:, :3], axis=-1))
    finally:
        trees_base._REGISTRY.pop("mine", None)
        sys.modules.pop("test_only_mine", None)


@pytest.mark.parametrize("chunks", [2, 7, 64])
@pytest.mark.parametrize("kind", KINDS)
def test_two_stage_vocab_top_k_equals_top_k(chunks, kind):
    from ddtree_jax.trees.ddtree import vocab_top_k

    logp = jnp.asarray(make_logp(kind, (3, 4, 1000), seed=chunks))
    for k in (1, 5, 15):
        want = jax.lax.top_k(logp, k)
        got = vocab_top_k(logp, k, chunks=chunks)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("stage1", ["xla", "threshold_interpret"])
@pytest.mark.parametrize("kind", KINDS + ["clustered"])
def test_two_stage_vocab_top_k_keeping_few_per_chunk_is_exact(kind, stage1):
    """keep < k: exact whether or not a chunk held more than `keep` of the top k (then the
    lax.cond falls back to one top_k). 'clustered' puts the best tokens in one chunk (always the
    fallback); 'ties' has ties across chunks at the k-th value (the strict check must catch them)."""
    from ddtree_jax.trees.ddtree import vocab_top_k

    if kind == "clustered":
        logp = np.array(make_logp("float", (2, 3, 1000), seed=5))
        logp[:, :, 100:140] += 30.0  # 40 best tokens, all in chunk 100..199 of 10
    else:
        logp = make_logp(kind, (2, 3, 1000), seed=11)
    logp = jnp.asarray(logp)
    fn = jax.jit(vocab_top_k, static_argnums=(1, 2, 3, 4))
    for k, chunks, keep in ((20, 10, 4), (40, 10, 8), (33, 7, 5), (64, 16, 8)):
        want = jax.lax.top_k(logp, k)
        got = fn(logp, k, chunks, keep, stage1)
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def _spy_launch_options(monkeypatch, module, name: str) -> list[dict]:
    """Wrap module.name (a kernel entry point) to record the impl / num_warps / radix_bits of each
    call; returns the list the calls are recorded in."""
    seen, real = [], getattr(module, name)

    def spy(*a, **k):
        seen.append({n: k[n] for n in ("impl", "num_warps", "radix_bits") if n in k})
        return real(*a, **k)

    monkeypatch.setattr(module, name, spy)
    return seen


def test_vocab_top_k_passes_the_first_stage_options(monkeypatch):
    """VocabTopK's num_warps / radix_bits reach chunk_top_k (the build's first stage, and the
    threshold second stage's), and the top-k is lax.top_k's with them."""
    seen = _spy_launch_options(monkeypatch, ddtree, "chunk_top_k")
    tuning = TreeTuning(vocab_topk=VocabTopK(chunks=8, keep=24, keep_from_k=100, radix_bits=4, num_warps=2))
    logp = jnp.asarray(make_logp("ties", (1, 3, 1000), seed=2))
    got = ddtree.tuned_vocab_top_k(logp, 24, tuning)
    want = jax.lax.top_k(logp, 24)
    assert seen == [dict(impl="threshold_interpret", num_warps=2, radix_bits=4)] * 2
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))


def test_select_second_stage_runs_select_top(monkeypatch):
    """stage2_select past stage2_max_k: the second stage is select_top, run as the tuning's
    kernels say, and the top-k is lax.top_k's."""
    seen = _spy_launch_options(monkeypatch, ddtree, "select_top")
    tuning = TreeTuning(vocab_topk=VocabTopK(chunks=8, keep=100, keep_from_k=100))
    logp = jnp.asarray(make_logp("ties", (1, 3, 1000), seed=4))
    assert ddtree._stage2(100, tuning) == "select_interpret"
    got = ddtree.tuned_vocab_top_k(logp, 100, tuning)
    want = jax.lax.top_k(logp, 100)
    assert seen == [dict(impl="pallas_interpret")]
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))


def test_two_stage_vocab_top_k_fast_path_taken_on_spread_input(monkeypatch):
    """On a vocabulary whose best tokens are spread over the chunks the kept candidates suffice:
    the fallback top_k must not run (checked by poisoning it)."""
    logp = jnp.asarray(make_logp("float", (1, 2, 4096), seed=3))
    want = jax.lax.top_k(logp, 32)
    real_top_k = jax.lax.top_k

    def poisoned(x, k):
        vals, idx = real_top_k(x, k)
        if x.shape[-1] == 4096:  # the full-vocabulary fallback (on total-order int keys)
            return jnp.full_like(vals, 12345), idx
        return vals, idx

    monkeypatch.setattr(ddtree.jax.lax, "top_k", poisoned)
    got = ddtree.vocab_top_k(logp, 32, chunks=64, keep=8)
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))


def test_vocab_top_k_settings():
    """The first stage is the threshold kernel (compiled or interpreted as the tuning says) in
    `chunks` chunks, each keeping `keep` from K >= keep_from_k and all K below; without a
    VocabTopK one lax.top_k."""
    topk = VocabTopK(chunks=128, keep=64, keep_from_k=512)
    assert ddtree._vocab_top_k_settings(16, TreeTuning(vocab_topk=topk)) == (128, None, "threshold_interpret")
    assert ddtree._vocab_top_k_settings(256, GPU_TREE) == (128, None, "threshold")
    assert ddtree._vocab_top_k_settings(1024, GPU_TREE) == (128, 64, "threshold")
    assert ddtree._vocab_top_k_settings(1024, TreeTuning()) == (None, None, "xla")
    assert ddtree._stage1_options(GPU_TREE) == dict(num_warps=4, radix_bits=2)
    assert ddtree._stage1_options(TreeTuning()) == {}


# vocab_top_k in one program per static setting, compiled once for every kind of value: called
# op by op, each interpreted kernel call traces its kernel anew and compiles it again
vocab_top_k_jit = jax.jit(ddtree.vocab_top_k, static_argnames=("k", "chunks", "keep", "stage1", "stage2"))


@pytest.mark.parametrize("stage1", ["xla", "threshold_interpret"])
@pytest.mark.parametrize("kind", KINDS + ["zeros"])
@pytest.mark.parametrize("shape,k,chunks", [((2, 3, 20000), 16, 128), ((1, 2, 30000), 64, 128),
                                            ((1, 5000), 40, 16), ((2, 4096), 8, 16),
                                            ((1, 70000), 44, 128)])   # padded chunks both stages
def test_second_stage_by_threshold_is_lax_top_k(stage1, kind, shape, k, chunks):
    """vocab_top_k's threshold second stage (the kernel over chunks of 1024 candidates, then a
    pairwise order) gives lax.top_k's values bit for bit (-0.0 below +0.0) and its indices
    (equal values: lower token first), after either first stage."""
    if kind == "zeros":
        rng = np.random.default_rng(k)
        x = jnp.asarray(np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(np.float32))
    else:
        x = jnp.asarray(make_logp(kind, shape if len(shape) == 3 else (1, *shape), seed=k).reshape(shape))
    want = jax.lax.top_k(x, k)
    got = vocab_top_k_jit(x, k=k, chunks=chunks, stage1=stage1, stage2="threshold_interpret")
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.int32), np.asarray(want[0]).view(np.int32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


def test_top_k_total_order_ranks_signed_zeros():
    """top_k_total_order (the second stage's lax.top_k and its fallback): -0.0 below +0.0, equal
    values by lower index, values bit for bit, float32 and bf16."""
    from ddtree_jax.trees.ddtree import top_k_total_order

    for dtype in (jnp.float32, jnp.bfloat16):
        x = jnp.asarray([[-0.0, 0.0, -1.0, -0.0, 0.0, -jnp.inf]], dtype)
        vals, pos = top_k_total_order(x, 5)
        assert vals.dtype == dtype
        assert pos.tolist() == [[1, 4, 0, 3, 2]]
        bits = np.asarray(vals.astype(jnp.float32)).view(np.uint32)[0]
        assert bits.tolist() == [0, 0, 0x80000000, 0x80000000, np.float32(-1.0).view(np.uint32)]


def test_stage2_setting():
    """The threshold second stage runs up to VocabTopK's stage2_max_k, only where every chunk
    keeps all K (the keep path has its own exactness check), and never without a VocabTopK;
    select_top (stage2_select) past it where the candidates fit one program."""
    def stage2(k, **topk):
        return ddtree._stage2(k, TreeTuning(vocab_topk=VocabTopK(**topk)))

    twin, pick = "threshold_interpret", "select_interpret"
    off = dict(stage2_select=False)
    assert [stage2(k, chunks=128, keep=64, keep_from_k=512, **off) for k in (16, 64, 128, 1024)] == [
        twin, twin, "xla", "xla"]
    assert stage2(16, chunks=128, keep=8, keep_from_k=8, **off) == "xla"   # chunks keep 8 < K: lax.top_k and its check
    assert stage2(16, chunks=128, keep=64, keep_from_k=512, stage2_max_k=0, **off) == "xla"
    assert ddtree._stage2(16, TreeTuning()) == "xla"
    # stage2_select: any K the candidates of which fit (after the threshold kernel's chunking)
    assert [stage2(k, chunks=128, keep=64, keep_from_k=512) for k in (16, 128, 256, 1024)] == [twin, pick, pick, pick]
    # 128 chunks keeping all 1024: 131072 candidates, each chunk of 1024 keeps them all
    assert stage2(1024, chunks=128, keep=64, keep_from_k=2048, stage2_max_k=0) == "xla"
    assert stage2(256, chunks=128, keep=64, keep_from_k=2048, stage2_max_k=0) == pick
    assert [ddtree._stage2(k, GPU_TREE) for k in (16, 64, 256, 1024)] == ["threshold", "threshold", "select", "select"]


@pytest.mark.parametrize("stage1", ["xla", "threshold_interpret"])
@pytest.mark.parametrize("kind", ["ties", "zeros"])
@pytest.mark.parametrize("shape,k,chunks,keep", [((2, 3, 20000), 200, 16, None), ((1, 2, 60000), 700, 64, 32),
                                                 ((1, 5000), 40, 16, 8), ((2, 4096), 100, 16, None),
                                                 ((1, 70000), 44, 128, None)])
def test_second_stage_by_select_is_lax_top_k(stage1, kind, shape, k, chunks, keep):
    """vocab_top_k's select second stage (the threshold kernel's chunks where they halve the
    candidates, select_top, a pairwise order of the K kept) gives lax.top_k's values bit for bit
    (-0.0 below +0.0) and its indices (equal values: lower token first), after either first
    stage, with every chunk keeping K or fewer (then behind the exactness check: 'ties' and
    'zeros' take its fallback)."""
    if kind == "zeros":
        rng = np.random.default_rng(k)
        x = jnp.asarray(np.where(rng.random(shape) < 0.5, 0.0, -0.0).astype(np.float32))
    else:
        x = jnp.asarray(make_logp(kind, shape if len(shape) == 3 else (1, *shape), seed=k).reshape(shape))
    want = jax.lax.top_k(x, k)
    got = vocab_top_k_jit(x, k=k, chunks=chunks, keep=keep, stage1=stage1, stage2="select_interpret")
    np.testing.assert_array_equal(np.asarray(got[0]).view(np.int32), np.asarray(want[0]).view(np.int32))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@pytest.mark.parametrize("kind", KINDS)
def test_ddtree_equals_heap_with_the_select_second_stage(kind):
    """The GPU's tree build at a large budget, CPU-sized: the select second stage (chunks
    keeping fewer than K, behind the exactness check) and pairwise ranks builds the heap's tree."""
    tuning = TreeTuning(rank_by_count_max=4096, vocab_topk=VocabTopK(chunks=16, keep=32, keep_from_k=256))
    assert ddtree._stage2(300, tuning) == "select_interpret"
    check_ddtree_against_heap((1, 6, 4000, 300), kind, seed=29, tuning=tuning)


@pytest.mark.parametrize("kind", KINDS)
def test_ddtree_equals_heap_with_the_threshold_second_stage(kind):
    """The GPU's vocabulary top-k with the threshold first and second stages builds the heap's tree."""
    tuning = TreeTuning(vocab_topk=VocabTopK(chunks=16, keep=64, keep_from_k=512, stage2_max_k=64))
    assert ddtree._stage2(40, tuning) == "threshold_interpret"
    check_ddtree_against_heap((1, 15, 4000, 40), kind, seed=23, tuning=tuning)
