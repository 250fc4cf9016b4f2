"""`--budget auto`: each round verifies the candidate tree with the most expected tokens a
millisecond. Whatever it picks the output is the AR output; where the costs leave one sensible
pick it is that fixed budget round for round; without a cost model it says so and runs at a fixed
budget. (Against the offline replay on the shipped pair: tests/test_research.py.)"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.cost import CostModel, ModelSignature, Point
from ddtree_jax.errors import ConfigError, UserError, cli_main
from ddtree_jax.generator import AUTO_FALLBACK, Executables, Generator
from ddtree_jax.sampling import SamplingConfig
from ddtree_jax.trees import make_policy
from tiny import tiny_pair

PROMPTS = [[5], [3, 9], [1, 2, 3, 4, 5, 6, 7]]
MAX_NEW = 24

# the module's Generators share what they compile alike (the prefill of a request shape, above all)
SHARED = Executables()


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def ar(pair):
    return Generator(pair, executables=SHARED, method="ar").generate_ids(PROMPTS, max_new_tokens=MAX_NEW)


def cost_model(pair, costs: dict, batches=(1, 4)) -> CostModel:
    """A model of flat costs (ms a round at any prefix and batch): candidate -> ms."""
    sig = ModelSignature.of(pair.target_cfg, pair.drafter_cfg, pair.target_params["embed"].dtype)
    points = []
    for c, ms in costs.items():
        method, nodes = ("dflash", pair.drafter_cfg.depth) if c == "dflash" else ("ddtree", c)
        points += [Point(method, b, nodes, 16, ms) for b in batches]
    return CostModel(jax.devices()[0].device_kind, sig, tuple(points))


def test_path_logp_and_first_nodes():
    """A tree's path log-probs are the sums of its nodes' log-probs down from the root (padding:
    probability 0); its first n nodes are the policy's tree at budget n (best first)."""
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(1), (2, 5, 11)) * 2, axis=-1)
    lp = np.asarray(logp)
    ddtree = make_policy("ddtree")
    big = ddtree.build(logp, 40)
    got = np.asarray(big.path_logp(logp))
    tokens, parents, depths, valid = (np.asarray(x) for x in (big.tokens, big.parents, big.depths, big.valid))
    for b in range(2):
        for i in range(1, big.num_nodes + 1):
            want, j = 0.0, i
            while j > 0:
                want += float(lp[b, depths[b, j] - 1, tokens[b, j]])
                j = parents[b, j]
            if valid[b, i]:
                assert got[b, i - 1] == pytest.approx(want, abs=1e-5)
            else:
                assert np.exp(got[b, i - 1]) == 0
        assert np.all(np.diff(got[b][valid[b, 1:]]) <= 1e-6)  # best first
    for n in (7, 16):
        cut, small = big.first(n), ddtree.build(logp, n)
        for name in ("tokens", "parents", "depths", "valid", "ancestor_mask"):
            assert np.array_equal(getattr(cut, name), getattr(small, name)), (n, name)
    assert big.first(1000).num_nodes == big.num_nodes


@pytest.mark.parametrize("costs, fixed", [
    ({16: 1.0, 64: 1000.0, 256: 1000.0}, ("ddtree", 16)),  # the small tree costs nothing against the rest
    ({"dflash": 1.0, 16: 1000.0, 64: 1000.0}, ("dflash", 0)),
])
def test_a_dominant_candidate_is_that_method_round_for_round(pair, ar, costs, fixed):
    gen = Generator(pair, executables=SHARED, method="ddtree", budget="auto", cost_model=cost_model(pair, costs),
                    auto_budgets=[c for c in costs if c != "dflash"])
    res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in res] == [r.token_ids for r in ar]
    method, budget = fixed
    want = Generator(pair, executables=SHARED, method=method, budget=budget or 64).generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.acceptance_lengths for r in res] == [r.acceptance_lengths for r in want]


def test_auto_with_the_oracle_drafter_is_lossless_and_speculates(pair, ar):
    """A drafter that is right (the oracle) with costs that favour the larger trees: still the AR
    tokens, and rounds accept several tokens."""
    from tiny import oracle_params

    oracle = oracle_params(pair, PROMPTS, MAX_NEW + 8)
    cm = cost_model(pair, {"dflash": 5.0, 16: 5.0, 64: 5.5, 256: 6.0})
    gen = Generator(pair, executables=SHARED, method="ddtree", budget="auto", cost_model=cm, oracle=oracle)
    res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in res] == [r.token_ids for r in ar]
    assert np.mean([a for r in res for a in r.acceptance_lengths]) > 3


def test_streaming_and_profile_take_the_same_rounds(pair, ar):
    cm = cost_model(pair, {"dflash": 3.0, 16: 3.5, 64: 4.0})
    gen = Generator(pair, executables=SHARED, method="ddtree", budget="auto", cost_model=cm, auto_budgets=(16, 64))
    fused = gen.generate_ids(PROMPTS[:1], max_new_tokens=MAX_NEW)
    streamed = gen.generate_ids(PROMPTS[:1], max_new_tokens=MAX_NEW, rounds_per_call=1)
    profiled = gen.generate_ids(PROMPTS[:1], max_new_tokens=MAX_NEW, profile=True)
    for r in (streamed, profiled):
        assert r[0].token_ids == fused[0].token_ids == ar[0].token_ids
        assert r[0].acceptance_lengths == fused[0].acceptance_lengths


def test_without_a_cost_model_it_warns_and_runs_at_the_fallback_budget(pair, ar):
    lines = []
    gen = Generator(pair, executables=SHARED, method="ddtree", budget="auto", log=lines.append)  # no model ships for this CPU
    assert gen.cost_model is None and any("no shipped cost model" in line for line in lines)
    res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    fixed = Generator(pair, executables=SHARED, method="ddtree", budget=AUTO_FALLBACK).generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.acceptance_lengths for r in res] == [r.acceptance_lengths for r in fixed]
    assert [r.token_ids for r in res] == [r.token_ids for r in ar]


def test_a_batch_the_model_does_not_cover_warns_once_and_runs_fixed(pair, ar):
    lines = []
    cm = cost_model(pair, {16: 1.0, 64: 2.0}, batches=(1,))
    gen = Generator(pair, executables=SHARED, method="ddtree", budget="auto", cost_model=cm, auto_budgets=(16, 64), log=lines.append)
    for _ in range(2):
        res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)  # batch 3: not covered
        assert [r.token_ids for r in res] == [r.token_ids for r in ar]
    assert sum("at batch 3" in line for line in lines) == 1, lines
    assert gen.spec_for(8, MAX_NEW, SamplingConfig(), batch=1).auto is not None


def test_bad_uses_are_one_line(pair, tmp_path):
    with pytest.raises(UserError, match="--budget auto sizes DDTree"):
        Generator(pair, executables=SHARED, method="dflash", budget="auto")
    with pytest.raises(UserError, match="--budget must be"):
        Generator(pair, executables=SHARED, method="ddtree", budget="64")
    with pytest.raises(UserError, match="auto_budgets"):
        Generator(pair, executables=SHARED, method="ddtree", budget="auto", auto_budgets=(0, 16))
    bad = tmp_path / "cost.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match=str(bad)):
        Generator(pair, executables=SHARED, method="ddtree", budget="auto", cost_model=bad)
    other = cost_model(pair, {16: 1.0})
    path = tmp_path / "other.json"
    other_json = other.to_json()
    other_json["model"]["layers"] += 1
    path.write_text(json.dumps(other_json))
    with pytest.raises(ConfigError, match="another model shape"):
        Generator(pair, executables=SHARED, method="ddtree", budget="auto", cost_model=path)


@pytest.mark.parametrize("args, needle", [
    (["--budget", "auto", "--method", "dflash"], "--budget auto sizes DDTree's tree"),
    (["--budget", "many"], "expected a number of draft nodes or auto"),
    (["--budget", "auto", "--cost-model", "/nonexistent/cost.json"], "/nonexistent/cost.json"),
    (["--budget", "auto", "--auto-budgets", "0,16"], "is not a DDTree budget >= 1"),
    (["--budget", "auto", "--auto-budgets", "16,x"], "is not a DDTree budget >= 1"),
])
def test_the_command_line_refuses_with_one_line(args, needle, capsys):
    from ddtree_jax import cli

    rc = cli_main(cli.main, ["--prompt", "x", "--max-new-tokens", "2", *args], prog="ddtree_jax.generate")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_the_command_line_passes_its_auto_budgets(monkeypatch):
    from ddtree_jax import cli, generator

    seen = {}

    def stop(ckpt, **kw):
        seen.update(kw)
        raise UserError("stopped before compiling")

    monkeypatch.setattr(generator, "Generator", stop)
    for extra, want in (([], (16, 32, 64)), (["--auto-budgets", "64,256"], (64, 256))):
        rc = cli_main(cli.main, ["--prompt", "x", "--max-new-tokens", "1", "--budget", "auto", *extra],
                      prog="ddtree_jax.generate")
        assert rc == 2 and seen["budget"] == "auto" and seen["auto_budgets"] == want


def test_a_cost_model_without_auto_has_no_effect(capsys):
    from ddtree_jax import cli

    rc = cli_main(cli.main, ["--prompt", "x", "--max-new-tokens", "1", "--method", "ar", "--cost-model", "f.json",
                             "--json"], prog="ddtree_jax.generate")
    assert rc == 0
    assert "warning: --cost-model has no effect with --method ar" in capsys.readouterr().err


def test_the_choice_inside_jit_sums_the_active_rows():
    """choose_budget as the engine calls it: rows that are done count for nothing."""
    from ddtree_jax.cost import choose_budget

    path = jnp.log(jnp.array([[0.9, 0.9, 0.9, 0.9], [0.05, 0.01, 0.0, 0.0]], jnp.float32))
    f = jax.jit(lambda active: choose_budget(path, (1, 4), jnp.array([1.0, 1.6]), active, presorted=True))
    assert int(f(jnp.array([True, True]))) == 1   # (1.9 + 1.05) / 1 < (4.6 + 1.06) / 1.6
    assert int(f(jnp.array([False, True]))) == 0  # 1.05 / 1 > 1.06 / 1.6


def test_the_compiled_round_copies_no_cache(pair):
    """The candidates' verify passes sit in one lax.switch whose branches return only the accepted
    path: with the caches through the switch XLA copied each cache around it every round."""
    from ddtree_jax import engine

    gen = Generator(pair, executables=SHARED, method="ddtree", budget="auto",
                    cost_model=cost_model(pair, {"dflash": 4.0, 8: 4.5, 32: 5.0}), auto_budgets=(8, 32))
    spec = gen.spec_for(8, MAX_NEW, SamplingConfig(), batch=1)
    assert spec.auto is not None and len(spec.auto.candidates) == 3
    static = dict(tcfg=gen.tcfg, dcfg=gen.dcfg, spec=spec)
    args = (jnp.ones((1, 8), jnp.int32), jnp.full((1,), 8, jnp.int32), jnp.full((1,), MAX_NEW, jnp.int32),
            engine.make_knobs(0.0, 1.0), jax.random.PRNGKey(0))
    state = engine.state_shapes(gen.tparams, gen.dparams, *args, **static)
    hlo = engine.run_rounds.lower(gen.tparams, gen.dparams, state, args[3], jnp.int32(2), **static).compile().as_text()
    assert "conditional(" in hlo
    caches = {"[" + ",".join(map(str, x.shape)) + "]" for x in (state.cache.k, state.dcache.k)}
    copied = [line for line in hlo.splitlines() if " copy(" in line and any(c in line.split("copy(")[0] for c in caches)]
    assert not copied, copied[:2]
