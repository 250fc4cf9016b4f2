"""Sampled speculative decoding follows the target's distribution (chi-square goodness of fit).

On a random model with an 8-token vocabulary the exact distribution of the first generated
tokens is computed from the target's logits; AR sampling and DDTree/DFlash sampling (thousands
of rows in one batch, fixed seeds) are tested against it at significance level 0.001. The tree
accepts sampled tokens often (checked), so the walk's sampling path is exercised, not bypassed.
"""
from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ddtree_jax.generator import Generator
from ddtree_jax.models import target as tmodel
from tiny import oracle_params, tiny_pair

ALPHA = 1e-3
N = 4000
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=8, layers=2, block_size=4, seed=5)


def processed(logits, temperature, top_k, top_p=1.0):
    x = np.asarray(logits, np.float64) / temperature
    if top_k:
        kth = np.sort(x, axis=-1)[..., -top_k][..., None]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    if top_p < 1.0:  # the smallest set of most likely tokens whose mass reaches top_p
        order = np.argsort(-p, axis=-1, kind="stable")
        ps = np.take_along_axis(p, order, axis=-1)
        keep = np.zeros_like(p, bool)
        np.put_along_axis(keep, order, (np.cumsum(ps, axis=-1) - ps) < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p = p / p.sum(-1, keepdims=True)
    return p


def exact_pairs(pair, temperature, top_k, top_p=1.0):
    """p(x1, x2) and p(x2, x3) under the processed target distribution."""
    v = pair.target_cfg.vocab_size
    seqs = np.array([PROMPT + list(t) for t in itertools.product(range(v), repeat=2)], np.int32)
    logits, _ = tmodel.forward_train(pair.target_params, pair.target_cfg, jnp.asarray(seqs))
    probs = processed(np.asarray(logits), temperature, top_k, top_p)  # [v*v, T, V]
    n = len(PROMPT)
    p1 = probs[0, n - 1]  # p(x1)
    p2 = probs[:, n, :].reshape(v, v, v)[:, 0, :]  # p(x2 | x1): position n sees x1 only
    p3 = probs[:, n + 1, :].reshape(v, v, v)  # p(x3 | x1, x2)
    joint12 = p1[:, None] * p2
    joint23 = np.einsum("a,ab,abc->bc", p1, p2, p3)
    return joint12, joint23


def gof(counts, expected_p):
    """Chi-square goodness of fit; cells with expectation < 5 are pooled."""
    counts, exp = counts.ravel(), expected_p.ravel() * counts.sum()
    small = exp < 5
    obs = np.append(counts[~small], counts[small].sum())
    ex = np.append(exp[~small], exp[small].sum())
    keep = ex > 0
    return stats.chisquare(obs[keep], ex[keep]).pvalue


def check_pairs(pair, toks, temperature, top_k, top_p=1.0):
    """The counts of (x1, x2) and (x2, x3) in toks [N, 3] fit the exact joints; returns both."""
    v = pair.target_cfg.vocab_size
    joint12, joint23 = exact_pairs(pair, temperature, top_k, top_p)
    c12 = np.zeros((v, v))
    np.add.at(c12, (toks[:, 0], toks[:, 1]), 1)
    c23 = np.zeros((v, v))
    np.add.at(c23, (toks[:, 1], toks[:, 2]), 1)
    assert gof(c12, joint12) > ALPHA
    assert gof(c23, joint23) > ALPHA
    return c12, c23, joint12, joint23


@pytest.mark.parametrize("method,budget,temperature,top_k,top_p", [
    ("ar", 0, 1.0, 0, 1.0),
    ("ddtree", 16, 1.0, 0, 1.0),
    ("dflash", 0, 1.0, 0, 1.0),
    ("ddtree", 7, 0.7, 3, 1.0),
    ("ddtree", 16, 3.0, 0, 0.9),  # the nucleus truncates: 4 and 17 of 64 cells left
])
def test_samples_follow_target_distribution(pair, method, budget, temperature, top_k, top_p):
    # The random drafter's top-1 chain is rarely right; the chain gets the oracle drafter (the
    # target's greedy continuation), so that sampled tokens are accepted along it.
    oracle = oracle_params(pair, [PROMPT], 3) if method == "dflash" else None
    if oracle is not None:
        oracle = {k: (jnp.broadcast_to(x, (N,) + x.shape[1:]) if x.ndim else x) for k, x in oracle.items()}
    gen = Generator(pair, method=method, budget=budget or 16, oracle=oracle)
    res = gen.generate_ids([PROMPT] * N, max_new_tokens=3, temperature=temperature, top_k=top_k, top_p=top_p,
                           seed=11)
    toks = np.array([r.token_ids for r in res])
    assert toks.shape == (N, 3)
    c12, c23, joint12, joint23 = check_pairs(pair, toks, temperature, top_k, top_p)
    # gof drops cells of probability 0 (top-k / top-p cut them): no sample may land there
    assert c12[joint12 == 0].sum() == 0 and c23[joint23 == 0].sum() == 0
    if method != "ar":
        accepted = np.mean([a > 1 for r in res for a in r.acceptance_lengths])
        assert accepted > 0.2, accepted  # drafted tokens were accepted in a good share of rounds


def test_an_moe_targets_samples_follow_its_distribution():
    """The same law with a mixture-of-experts target: the verify routes every tree node's token
    through the experts, and DDTree's samples still follow the target's distribution."""
    pair = tiny_pair(vocab=8, layers=2, block_size=4, seed=5, moe=True)
    res = Generator(pair, method="ddtree", budget=16).generate_ids([PROMPT] * N, max_new_tokens=3, temperature=1.0,
                                                                   seed=17)
    check_pairs(pair, np.array([r.token_ids for r in res]), 1.0, 0)
    assert np.mean([a > 1 for r in res for a in r.acceptance_lengths]) > 0.2


def test_budget_auto_samples_follow_target_distribution(pair):
    """--budget auto: each round's tree is one of several (a lax.switch over the candidates' verify
    passes); the samples still follow the target's distribution."""
    import jax

    from ddtree_jax.cost import CostModel, ModelSignature, Point

    sig = ModelSignature.of(pair.target_cfg, pair.drafter_cfg, pair.target_params["embed"].dtype)
    points = [Point("dflash", b, pair.drafter_cfg.depth, 4, 4.0) for b in (1, N)]
    points += [Point("ddtree", b, n, 4, ms) for b in (1, N) for n, ms in ((4, 4.5), (16, 5.0))]
    cm = CostModel(jax.devices()[0].device_kind, sig, tuple(points))
    gen = Generator(pair, method="ddtree", budget="auto", cost_model=cm, auto_budgets=(4, 16))
    assert gen.auto_lines(N).candidates == ("dflash", 4, 16)
    res = gen.generate_ids([PROMPT] * N, max_new_tokens=3, temperature=1.0, seed=13)
    check_pairs(pair, np.array([r.token_ids for r in res]), 1.0, 0)


def test_wrong_distribution_is_detected(pair):
    """The test has power: samples at the wrong temperature fail it."""
    gen = Generator(pair, method="ar")
    res = gen.generate_ids([PROMPT] * N, max_new_tokens=2, temperature=1.6, seed=2)
    toks = np.array([r.token_ids for r in res])
    joint12, _ = exact_pairs(pair, 1.0, 0)
    c12 = np.zeros(joint12.shape)
    np.add.at(c12, (toks[:, 0], toks[:, 1]), 1)
    assert gof(c12, joint12) < ALPHA


def test_nucleus_matches_reference():
    """process_logits' top-p keeps exactly the smallest most-likely set reaching top_p (ties in
    random float logits do not occur), after temperature and top-k; the top token always; its
    deterministic mode's fixed-order sums too."""
    from ddtree_jax.sampling import process_logits

    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, 50)).astype(np.float32) * 3
    for (temperature, top_k, top_p), det in itertools.product(
            [(1.0, 0, 0.9), (0.5, 10, 0.5), (2.0, 0, 1e-6), (1.0, 5, 0.999)], (False, True)):
        x = process_logits(jnp.asarray(logits), jnp.float32(temperature), top_k, jnp.float32(top_p), det)
        got = np.isfinite(np.asarray(x))
        want = processed(logits, temperature, top_k, top_p) > 0
        np.testing.assert_array_equal(got, want)
        assert got.sum(-1).min() >= 1
        kept = np.asarray(x)[got]
        np.testing.assert_allclose(kept, (logits / temperature)[got], rtol=1e-6)
