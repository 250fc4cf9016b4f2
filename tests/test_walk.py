"""The acceptance walk against a plain-Python walk, on policy trees and on random trees, with
random target tokens and with targets that follow a chosen root path (deep acceptance).

`DDTREE_FUZZ_EXAMPLES=5000 pytest tests/test_walk.py` runs a long fuzz.
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import FAST_COMPILE

from ddtree_jax.trees import DraftTree, make_policy
from ddtree_jax.walk import WalkResult, walk

EXAMPLES = int(os.environ.get("DDTREE_FUZZ_EXAMPLES", "30"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# (policy, (batch, D, V), budget); small vocabularies make random targets match often.
POLICY_CASES = [
    ("ddtree", (3, 4, 3), 10),
    ("ddtree", (2, 8, 5), 33),
    ("ddtree", (2, 3, 2), 20),  # 14 distinct paths: 6 invalid slots with token 0
    ("beam:width=2", (2, 6, 4), 12),
    ("chain", (2, 8, 50), 8),
    ("static:tree=0;1;0.0;0.1;1.0;0.0.0", (2, 4, 3), 6),
]
# (batch, N, D, V) for random trees with arbitrary shapes, invalid slots included.
RANDOM_CASES = [(3, 10, 3, 4), (2, 33, 8, 3), (1, 1, 1, 2), (2, 20, 5, 50)]


@functools.lru_cache(maxsize=None)
def compiled(fn, *static):
    """`fn` jitted with its trailing arguments `static`, compiled per input shapes."""
    cache = {}

    def call(*args):
        key = tuple((a.shape, str(a.dtype)) for a in jax.tree_util.tree_leaves(args))
        if key not in cache:
            lowered = jax.jit(lambda *a: fn(*a, *static)).lower(*args)
            cache[key] = lowered.compile(compiler_options=FAST_COMPILE)
        return cache[key](*args)

    return call


def policy_build(logp, spec: str, budget: int) -> DraftTree:
    return make_policy(spec).build(logp, budget)


def policy_tree(spec: str, shape: tuple[int, int, int], budget: int, seed: int) -> DraftTree:
    rng = np.random.default_rng(seed)
    logp = jax.nn.log_softmax(jnp.asarray(rng.normal(size=shape) * 2, jnp.float32), axis=-1)
    tree = compiled(policy_build, spec, budget)(logp)
    return tree.with_root_token(jnp.asarray(rng.integers(0, shape[2], shape[0]), jnp.int32))


def random_tree(batch: int, n: int, depth: int, vocab: int, seed: int) -> DraftTree:
    """Any topologically ordered tree with distinct sibling tokens; invalid slots carry random
    tokens on purpose (the walk must ignore them by `valid`, not by token)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (batch, n + 1)).astype(np.int32)
    parents = np.zeros((batch, n + 1), np.int32)
    depths = np.ones((batch, n + 1), np.int32)
    valid = np.zeros((batch, n + 1), bool)
    parents[:, 0], depths[:, 0], valid[:, 0] = -1, 0, True
    for b in range(batch):
        for i in range(1, n + 1):
            options = [p for p in range(i) if valid[b, p] and depths[b, p] < depth]
            p = int(rng.choice(options))
            used = {tokens[b, j] for j in range(1, i) if valid[b, j] and parents[b, j] == p}
            free = [t for t in range(vocab) if t not in used]
            if not free or rng.random() < 0.15:
                continue  # stays invalid
            parents[b, i], depths[b, i], tokens[b, i], valid[b, i] = p, depths[b, p] + 1, rng.choice(free), True
    mask = np.zeros((batch, n + 1, n + 1), bool)
    for b in range(batch):
        for i in range(n + 1):
            j = i
            while j >= 0:
                mask[b, i, j] = True
                j = parents[b, j] if j > 0 else -1
    return DraftTree(*(jnp.asarray(x) for x in (tokens, parents, depths, valid, mask)))


def targets_for(tree: DraftTree, vocab: int, follow: bool, seed: int) -> np.ndarray:
    """Random target tokens; with `follow`, rewritten along a random valid node's root path so
    the walk reaches that node (and maybe beyond, by chance)."""
    rng = np.random.default_rng(seed)
    tokens, parents, valid = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.valid))
    target = rng.integers(0, vocab, tokens.shape).astype(np.int32)
    if follow:
        for b in range(tokens.shape[0]):
            i = int(rng.choice(np.flatnonzero(valid[b])))
            while i > 0:
                target[b, parents[b, i]] = tokens[b, i]
                i = parents[b, i]
    return target


def reference_walk(tree: DraftTree, target: np.ndarray, depth: int) -> dict[str, np.ndarray]:
    tokens, parents, valid = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.valid))
    batch, slots = tokens.shape
    out = {k: np.zeros((batch, depth + 1), np.int32) for k in ("path", "tokens")}
    out["num_accepted"] = np.zeros(batch, np.int32)
    out["bonus"] = np.zeros(batch, np.int32)
    for b in range(batch):
        path = [0]
        while len(path) <= depth:
            cur = path[-1]
            kids = [i for i in range(1, slots) if valid[b, i] and parents[b, i] == cur and tokens[b, i] == target[b, cur]]
            assert len(kids) <= 1, "sibling tokens must be distinct"
            if not kids:
                break
            path.append(kids[0])
        n = len(path) - 1
        bonus = target[b, path[-1]]
        out["path"][b, : n + 1] = path
        out["tokens"][b, : n + 1] = [tokens[b, i] for i in path[1:]] + [bonus]
        out["num_accepted"][b] = n
        out["bonus"][b] = bonus
    return out


def check_walk(tree: DraftTree, target: np.ndarray, depth: int) -> WalkResult:
    result = compiled(walk, depth)(tree, jnp.asarray(target))
    got = {f.name: np.asarray(getattr(result, f.name)) for f in dataclasses.fields(result)}
    want = reference_walk(tree, target, depth)
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
        assert got[k].dtype == np.int32, k
    check_properties(tree, target, got, depth)
    return result


def check_properties(tree: DraftTree, target: np.ndarray, got: dict[str, np.ndarray], depth: int) -> None:
    tokens, parents, depths, valid = (np.asarray(x) for x in (tree.tokens, tree.parents, tree.depths, tree.valid))
    for b in range(tokens.shape[0]):
        n, path = int(got["num_accepted"][b]), got["path"][b]
        assert 0 <= n <= depth and path[0] == 0
        for k in range(1, n + 1):  # a root path whose tokens are the target's at the parents
            s = path[k]
            assert valid[b, s] and parents[b, s] == path[k - 1] and depths[b, s] == k
            assert tokens[b, s] == target[b, path[k - 1]] == got["tokens"][b, k - 1]
        assert got["bonus"][b] == target[b, path[n]] == got["tokens"][b, n]
        assert not path[n + 1 :].any() and not got["tokens"][b, n + 1 :].any()
        if n < depth:  # maximal: no valid child of the last node matches
            last = path[n]
            kids = valid[b] & (parents[b] == last) & (tokens[b] == target[b, last])
            kids[0] = False
            assert not kids.any()


@FUZZ
@given(case=st.sampled_from(POLICY_CASES), follow=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_walk_matches_reference_on_policy_trees(case, follow, seed):
    spec, shape, budget = case
    tree = policy_tree(spec, shape, budget, seed)
    check_walk(tree, targets_for(tree, shape[2], follow, seed + 1), depth=shape[1])


@FUZZ
@given(case=st.sampled_from(RANDOM_CASES), follow=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_walk_matches_reference_on_random_trees(case, follow, seed):
    batch, n, depth, vocab = case
    tree = random_tree(batch, n, depth, vocab, seed)
    check_walk(tree, targets_for(tree, vocab, follow, seed + 1), depth=depth)


def test_walk_by_hand():
    # root -> 1 (tok 5) -> 3 (tok 7) ; root -> 2 (tok 6) ; slot 4 invalid with token 5
    parents = np.array([[-1, 0, 0, 1, 0]], np.int32)
    tree = DraftTree(
        tokens=jnp.array([[9, 5, 6, 7, 5]], jnp.int32),
        parents=jnp.asarray(parents),
        depths=jnp.array([[0, 1, 1, 2, 1]], jnp.int32),
        valid=jnp.array([[True, True, True, True, False]]),
        ancestor_mask=jnp.asarray(np.array([[[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 0, 0, 1]]], bool)),
    )
    r = check_walk(tree, np.array([[5, 7, 0, 4, 0]], np.int32), depth=3)
    assert r.path.tolist() == [[0, 1, 3, 0]] and r.num_accepted.tolist() == [2]
    assert r.tokens.tolist() == [[5, 7, 4, 0]] and r.bonus.tolist() == [4]
    r = check_walk(tree, np.array([[8, 7, 0, 4, 0]], np.int32), depth=3)  # nothing accepted
    assert r.path.tolist() == [[0, 0, 0, 0]] and r.tokens.tolist() == [[8, 0, 0, 0]]


def test_root_only_tree_gives_the_plain_next_token():
    r = compiled(walk, 4)(DraftTree.root_only(2), jnp.array([[3], [4]], jnp.int32))
    assert r.num_accepted.tolist() == [0, 0] and r.tokens[:, 0].tolist() == [3, 4]
    assert r.path.shape == (2, 5) and not r.tokens[:, 1:].any()
    assert isinstance(jax.tree_util.tree_map(lambda x: x, r), WalkResult)
