"""The verify-cost model (ddtree_jax.cost), the `--budget auto` chooser, bench fit-cost and the
tokens/s projection."""
from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax import cost
from ddtree_jax.cost import CostModel, ModelSignature, Point
from ddtree_jax.errors import ConfigError, cli_main

ROOT = Path(__file__).resolve().parents[1]
SIG = ModelSignature(layers=4, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=512,
                     dtype="float32", drafter_layers=1, block_size=8)
H100 = "NVIDIA H100 80GB HBM3"


def synthetic(ms=None) -> CostModel:
    """Batches 1 and 4, DDTree 16/64/256, prefixes 512 and 4096: ms = 2 + batch x rows / 100 +
    prefix / 1000 (AR: 1 + prefix / 2000, DFlash: 3 + batch / 10 + prefix / 1000)."""
    ms = ms or {}
    pts = []
    for batch in (1, 4):
        for prefix in (512, 4096):
            pts.append(Point("ar", batch, 0, prefix, 1 + prefix / 2000))
            pts.append(Point("dflash", batch, 7, prefix, 3 + batch / 10 + prefix / 1000))
            for n in (16, 64, 256):
                pts.append(Point("ddtree", batch, n, prefix, ms.get((batch, n, prefix), 2 + batch * (n + 1) / 100
                                                                    + prefix / 1000)))
    return CostModel("Test GPU", SIG, tuple(pts), "call", "synthetic")


def test_interpolation_exact_at_points_linear_between_and_refused_outside():
    cm = synthetic()
    f = lambda b, n, p: 2 + b * (n + 1) / 100 + p / 1000  # noqa: E731
    for b, n, p in [(1, 16, 512), (4, 256, 4096), (1, 64, 4096)]:
        assert cm.round_ms(n, b, p) == pytest.approx(f(b, n, p), rel=1e-6)
    assert cm.round_ms(40, 1, 512) == pytest.approx(f(1, 40, 512), rel=1e-6)  # piecewise linear in rows
    assert cm.round_ms(64, 2, 512) == pytest.approx(f(2, 64, 512), rel=1e-6)  # linear in batch
    assert cm.round_ms(64, 1, 2000) == pytest.approx(f(1, 64, 2000), rel=1e-6)  # linear in prefix
    assert cm.round_ms(64, 1, 8192) == pytest.approx(f(1, 64, 8192), rel=1e-6)  # extrapolated above
    assert cm.round_ms(64, 1, 100) == pytest.approx(f(1, 64, 512), rel=1e-6)  # clamped below
    assert cm.round_ms("ar", 2, 4096) == pytest.approx(1 + 4096 / 2000, rel=1e-6)
    assert cm.round_ms("dflash", 4, 512) == pytest.approx(3.4 + 0.512, rel=1e-6)
    for cand, batch in [(8, 1), (512, 1), (64, 8), ("ar", 16)]:
        assert not cm.covers(cand, batch)
        with pytest.raises(ConfigError, match=r"does not cover .* at batch .*fit-cost") as e:
            cm.round_ms(cand, batch, 512)
        assert "\n" not in str(e.value)
    assert cm.candidates(2) == ("ar", "dflash", 16, 64, 256)
    assert "ddtree batch 4: budgets 16..256 (measured 16, 64, 256) prefix 512..4096" in cm.describe()


def test_a_single_prefix_is_flat_and_said_so():
    cm = CostModel("Test GPU", SIG, (Point("ddtree", 1, 64, 512, 8.0), Point("ddtree", 1, 256, 512, 10.0)))
    assert cm.round_ms(64, 1, 8192) == 8.0 and cm.round_ms(160, 1, 512) == pytest.approx(9.0)
    assert cm.describe() == "ddtree batch 1: budgets 64..256 (measured 64, 256) prefix 512 only (flat in prefix)"


def test_monotone_in_rows_and_batch_despite_noise():
    # DDTree-64 measured cheaper than -16 at batch 4, and batch 4's -256 cheaper than batch 1's
    cm = synthetic({(4, 64, 512): 1.0, (4, 256, 4096): 1.0})
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = float(rng.uniform(0, 10000))
        b = float(rng.uniform(1, 4))
        n0, n1 = sorted(rng.integers(16, 257, size=2).tolist())
        assert cm.round_ms(n0, b, p) <= cm.round_ms(n1, b, p) + 1e-5
        b0, b1 = sorted(rng.uniform(1, 4, size=2).tolist())
        assert cm.round_ms(n0, b0, p) <= cm.round_ms(n0, b1, p) + 1e-5
        assert cm.round_ms(n0, b, p) <= cm.round_ms(n0, b, p + 100) + 1e-5
    assert cm.round_ms(64, 4, 512) == pytest.approx(cm.round_ms(16, 4, 512))  # raised to the one before


def test_json_round_trip(tmp_path):
    cm = synthetic()
    path = cm.save(tmp_path / "sub" / "cost.json")
    back = cost.load_cost_model(path)
    assert back == cm and back.to_json() == cm.to_json()
    assert back.round_ms(100, 3, 3000) == cm.round_ms(100, 3, 3000)
    assert not list(tmp_path.glob("sub/*.tmp"))


def test_an_moe_targets_signature_is_its_experts_too(tmp_path):
    """A dense model's file carries no expert fields (files from before them read the same); an
    MoE target's carries its experts, and a dense model is not taken for it."""
    from ddtree_jax.models.config import MoeConfig

    from tiny import tiny_pair

    pair = tiny_pair()
    dense = ModelSignature.of(pair.target_cfg, pair.drafter_cfg, "float32")
    moe_cfg = dataclasses.replace(pair.target_cfg, moe=MoeConfig(num_experts=8, top_k=2, expert_intermediate=32,
                                                                 norm_topk_prob=True, sparse_layers=(True, True)))
    moe = ModelSignature.of(moe_cfg, pair.drafter_cfg, "float32")
    assert "experts" not in dense.to_json() and (moe.experts, moe.top_k, moe.expert_intermediate) == (8, 2, 32)
    cm = cost.CostModel(H100, moe, (cost.Point("ar", 1, 0, 512, 5.0),))
    back = cost.load_cost_model(cm.save(tmp_path / "moe.json"), device_kind=H100, model=moe)
    assert back.model == moe
    with pytest.raises(ConfigError, match="experts 8 against 0, top_k 2 against 0"):
        cost.load_cost_model(tmp_path / "moe.json", device_kind=H100, model=dense)


def _good() -> dict:
    return synthetic().to_json()


def _set(path, value):
    def edit(obj):
        *head, last = path
        for k in head:
            obj = obj[k]
        if value is _DROP:
            del obj[last]
        else:
            obj[last] = value
    return edit


_DROP = object()
MALFORMED = [  # (edit of a good file, what the one line must say)
    (lambda o: [o], r"not a JSON object"),
    (_set(["format"], "other"), r"format is \"other\".*not a cost model file"),
    (_set(["version"], 2), r"version is 2; this code reads version 1"),
    (_set(["device_kind"], _DROP), r"device_kind is missing"),
    (_set(["device_kind"], ""), r"device_kind is \"\"; it must be a non-empty string"),
    (_set(["source"], 3), r"source is 3; it must be a string"),
    (_set(["metric"], "p50"), r"metric is 'p50'; it must be one of call, steady"),
    (_set(["extra"], 1), r"extra is not a field here"),
    (_set(["model"], [1]), r"model is \[1\]; it must be an object"),
    (_set(["model", "vocab"], _DROP), r"model.vocab is missing"),
    (_set(["model", "layers"], 0), r"model.layers is 0; it must be an integer >= 1"),
    (_set(["model", "layers"], "36"), r"model.layers is \"36\"; it must be an integer >= 1"),
    (_set(["model", "heads"], True), r"model.heads is true; it must be an integer >= 1"),
    (_set(["model", "dtype"], "bf17"), r"model.dtype is \"bf17\"; it must name a dtype"),
    (_set(["points"], []), r"points is \[\]; it must be a non-empty list"),
    (_set(["points", 0], 5), r"points\[0\] is 5; it must be an object"),
    (_set(["points", 1, "round_ms"], _DROP), r"points\[1\].round_ms is missing"),
    (_set(["points", 1, "method"], "tree"), r"points\[1\].method is \"tree\"; it must be one of ar, dflash, ddtree"),
    (_set(["points", 2, "batch"], 0), r"points\[2\].batch is 0; it must be an integer >= 1"),
    (_set(["points", 2, "nodes"], -1), r"points\[2\].nodes is -1; it must be an integer >= 0"),
    (_set(["points", 2, "prefix"], 1.5), r"points\[2\].prefix is 1.5; it must be an integer >= 1"),
    (_set(["points", 2, "round_ms"], 0), r"points\[2\].round_ms is 0; it must be a number of ms > 0"),
    (_set(["points", 2, "round_ms"], float("nan")), r"points\[2\].round_ms is NaN"),
    (_set(["points", 2, "round_ms"], "8"), r"points\[2\].round_ms is \"8\""),
    (_set(["points", 0, "nodes"], 3), r"point 0 \(ar\) has nodes 3; ar verifies 0 nodes"),
    (_set(["points", 1, "nodes"], 15), r"point 1 \(dflash\) has nodes 15; dflash verifies 7 nodes at block size 8"),
    (lambda o: o["points"].append(dict(o["points"][2])), r"point \d+ repeats method ddtree, batch 1, nodes 16"),
    (_set(["points"], [dict(method="ar", batch=1, nodes=0, prefix=p, round_ms=ms)
                       for p, ms in [(512, 0.1), (1024, 0.1), (1536, 10.0)]]),
     r"fall so steeply with the prefix"),
]


@pytest.mark.parametrize("edit,want", MALFORMED, ids=[w[:30] for _, w in MALFORMED])
def test_every_malformed_file_is_one_line_naming_the_file_and_the_fix(tmp_path, edit, want):
    obj = _good()
    obj = edit(obj) or obj
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(ConfigError) as e:
        cost.load_cost_model(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(str(path)) and "fit-cost" in msg, msg
    assert re.search(want, msg), msg


def test_unreadable_files_and_the_cli_exit(tmp_path, capsys):
    from bench import projection

    missing = tmp_path / "none.json"
    bad = tmp_path / "bad.json"
    bad.write_text("{\"format\": ")
    for path, want in [(missing, "not found; give a file written by python -m bench fit-cost"),
                       (bad, "is not valid JSON")]:
        with pytest.raises(ConfigError, match=want):
            cost.load_cost_model(path)
        acc = tmp_path / "acc.json"
        acc.write_text("{}")
        code = cli_main(projection.main, ["--cost", str(path), "--acceptance", str(acc), "--out", str(tmp_path)],
                        prog="projection")
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and str(path) in err and want in err, err


def test_wrong_device_or_model_and_the_default(tmp_path):
    path = synthetic().save(tmp_path / "cost.json")
    with pytest.raises(ConfigError, match=r"was fit on Test GPU, not this NVIDIA H200; refit it here"):
        cost.load_cost_model(path, device_kind="NVIDIA H200")
    other = dataclasses.replace(SIG, layers=36, dtype="bfloat16")
    with pytest.raises(ConfigError, match=r"another model shape \(layers 4 against 36, dtype float32 against "
                                          r"bfloat16\); refit it for this model"):
        cost.load_cost_model(path, device_kind="Test GPU", model=other)
    with pytest.raises(ConfigError, match="was fit on"):  # a file the user named must match
        cost.resolve_cost_model(path, "NVIDIA H200", SIG)
    assert cost.resolve_cost_model(path, "Test GPU", SIG) == (synthetic(), None)
    cm, warning = cost.resolve_cost_model(None, "NVIDIA A100-SXM4-80GB", SIG)  # none shipped: a warning, no model
    assert cm is None and "no shipped cost model for NVIDIA A100-SXM4-80GB" in warning and "fit-cost" in warning


def test_shipped_h100_model_is_the_results_rows_at_the_8b_shape():
    from bench.fit_cost import signature

    sig = signature("qwen3-8b", "bfloat16", "test")
    cm = cost.default_cost_model(H100, sig)
    assert cm is not None and cm.device_kind == H100 and cm.metric == "call" and "4dc328d" in cm.source
    assert cost.default_cost_model("NVIDIA H100 PCIe", sig) is None
    assert cost.default_cost_model(H100, dataclasses.replace(sig, dtype="float32")) is None
    # every shipped number is in RESULTS.md's H100 rows that the source names: batch 1 from the A/B
    # row (its head side), batches 4 and 16 from the by-batch row
    lines = (ROOT / "bench" / "RESULTS.md").read_text().splitlines()
    ab = next(line for line in lines if "the shipped cost model's batch-1 points" in line)
    by_batch = next(line for line in lines if "rounds by batch, 1 / 4 / 16 rows" in line)
    b32 = next(line for line in lines if "rounds at batch 32, one start" in line)
    assert "4dc328d" in ab and "96c1c4d" in by_batch and "96c1c4d" in cm.source
    assert "e923fe0" in b32 and "e923fe0" in cm.source
    column = {4: 1, 16: 2}
    for p in cm.points:
        name = {"ar": "AR", "dflash": "DFlash", "ddtree": "DDTree-64"}[p.method]
        if p.batch == 1:
            assert f"/ {p.round_ms:.3f}" in ab, p
        elif p.batch == 32:
            assert f"{name} {p.round_ms:.3f}" in b32, p
        else:
            figures = by_batch.split(f"{name} ")[1].split(";")[0].split(" ms")[0].split(" / ")
            assert float(figures[column[p.batch]]) == p.round_ms, p
    assert cm.candidates(1) == ("ar", "dflash", 64, 256) and cm.candidates(4) == ("ar", "dflash", 64)
    assert cm.candidates(32) == ("ar", "dflash", 64)


def test_shipped_h200_model_is_the_results_rows_at_batch_1():
    """The H200's shipped points are the midpoints of its RESULTS.md rows' call figures."""
    from bench.fit_cost import signature

    cm = cost.default_cost_model("NVIDIA H200", signature("qwen3-8b", "bfloat16", "test"))
    assert cm is not None and cm.metric == "call" and cm.candidates(1) == ("ar", "dflash", 16, 64, 256)
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    h200 = text.split("## NVIDIA H200")[1].split("\n## ")[0].splitlines()
    rows = {("ar", 0): ("| AR step |", "4.35 ms a call"), ("dflash", 15): ("| DFlash round", "5.62 a call"),
            ("ddtree", 16): ("| DDTree-16 round", "5.81-5.83 a call"),
            ("ddtree", 64): ("| DDTree-64 round", "5.94-5.95 a call"),
            ("ddtree", 256): ("| DDTree-256 round", "9.96-9.97 a call")}
    assert sorted((p.method, p.nodes) for p in cm.points) == sorted(rows)
    for p in cm.points:
        start, figure = rows[(p.method, p.nodes)]
        assert any(line.startswith(start) and figure in line for line in h200), (start, figure)
        lo, _, hi = figure.split(" ")[0].partition("-")
        assert p.batch == 1 and p.round_ms == pytest.approx((float(lo) + float(hi or lo)) / 2)


# -- the chooser ---------------------------------------------------------------------------------


def brute_force(path_logp, cands, ms, active, chain_logp):
    """Expected tokens per ms of the batch under each candidate, by loops in float64."""
    rates = []
    for k, c in enumerate(cands):
        total = 0.0
        for b in range(path_logp.shape[0]):
            if not active[b]:
                continue
            probs = sorted((math.exp(x) for x in path_logp[b].astype(np.float64)), reverse=True)
            if c == "ar":
                total += 1
            elif c == "dflash":
                total += 1 + sum(math.exp(x) for x in chain_logp[b].astype(np.float64))
            else:
                total += 1 + sum(probs[:c])
        rates.append(total / float(ms[k]))
    return np.asarray(rates)


def random_case(rng):
    batch, n = int(rng.integers(1, 6)), int(rng.integers(1, 40))
    logp = np.log(rng.uniform(1e-4, 1, size=(batch, n))).astype(np.float32)
    logp[rng.uniform(size=logp.shape) < 0.2] = -np.inf  # padding nodes
    budgets = sorted(set(rng.integers(1, 48, size=int(rng.integers(1, 6))).tolist()))
    cands = tuple(["ar", "dflash"][: int(rng.integers(0, 3))] + budgets)
    ms = rng.uniform(1, 10, size=len(cands)).astype(np.float32)
    active = rng.uniform(size=batch) < 0.8
    chain = np.cumsum(np.log(rng.uniform(0.05, 1, size=(batch, 7))), axis=-1).astype(np.float32)
    return logp, cands, ms, active, chain


def test_chooser_matches_brute_force_numpy_and_jit():
    rng = np.random.default_rng(1)
    for case in range(150):
        logp, cands, ms, active, chain = random_case(rng)
        ref = brute_force(logp, cands, ms, active, chain)
        got_np = int(cost.choose_budget_np(logp, cands, ms, active, chain_logp=chain))
        got_jit = got_np
        if case % 10 == 0:  # a compile each: a sample
            got_jit = int(jax.jit(lambda lp, m, a, ch, cands=cands: cost.choose_budget(lp, cands, m, a, chain_logp=ch))(
                logp, ms, active, chain))
        best = ref.max()
        for got in (got_np, got_jit):
            assert ref[got] >= best * (1 - 1e-5), (cands, ref, got)
        top = np.sort(ref)[::-1]
        if len(ref) == 1 or top[0] - top[1] > 1e-4 * best:  # a clear winner: the same index
            assert got_np == got_jit == int(np.argmax(ref))


def test_chooser_ties_done_rows_and_sorting():
    logp = np.log(np.array([[0.5, 0.9, 0.25, -0.0, 0.0]], np.float32).clip(1e-30))
    logp[0, 3:] = -np.inf  # three real nodes
    # budgets 3 and 8 verify the same three nodes at the same cost: the first listed wins
    assert int(cost.choose_budget_np(logp, (3, 8), np.array([4.0, 4.0]))) == 0
    assert int(cost.choose_budget_np(logp, (8, 3), np.array([4.0, 4.0]))) == 0
    assert int(cost.choose_budget(jnp.asarray(logp), (8, 3), jnp.array([4.0, 4.0]))) == 0
    # unsorted input is sorted: budget 1 takes the 0.9 node, not the first slot's 0.5
    exp = cost.expected_tokens(logp, ("ar", 1, 2, 3, 8), xp=np)
    np.testing.assert_allclose(exp, [[1, 1.9, 2.4, 2.65, 2.65]], rtol=1e-6)
    # presorted skips the sort: the caller's order is taken as best first
    np.testing.assert_allclose(cost.expected_tokens(logp, (1,), presorted=True, xp=np), [[1.5]], rtol=1e-6)
    # a done row counts for nothing: the other row decides; no row active -> 0
    two = np.stack([np.log(np.full(8, 0.9, np.float32)), np.log(np.full(8, 1e-3, np.float32))])
    ms = np.array([1.0, 2.0])
    assert int(cost.choose_budget_np(two, ("ar", 8), ms, np.array([True, False]))) == 1
    assert int(cost.choose_budget_np(two, ("ar", 8), ms, np.array([False, True]))) == 0
    assert int(cost.choose_budget_np(two, (8, "ar"), ms, np.array([False, False]))) == 0
    with pytest.raises(ValueError, match="needs chain_logp"):
        cost.choose_budget_np(two, ("dflash",), ms[:1])
    for bad in [(0,), ("chain",), (4, 4), ()]:
        with pytest.raises(ValueError, match="candidate"):
            cost.check_candidates(bad)


def test_chooser_inside_jit_with_the_cost_lines():
    cm = synthetic()
    lines = cm.lines(("ar", 16, 64, 256), batch=4)

    @jax.jit
    def pick(logp, prefix, active):
        return cost.choose_budget(logp, lines.candidates, lines.at(prefix), active)

    rng = np.random.default_rng(2)
    for _ in range(10):
        logp = np.log(rng.uniform(0.01, 1, size=(4, 256)) ** 4).astype(np.float32)
        prefix = float(rng.uniform(0, 6000))
        active = rng.uniform(size=4) < 0.8
        ms = np.asarray([cm.round_ms(c, 4, prefix) for c in lines.candidates])
        np.testing.assert_allclose(lines.at(prefix, xp=np), ms, rtol=1e-5)
        want = np.argmax(brute_force(logp, lines.candidates, ms, active, None))
        assert int(pick(logp, jnp.float32(prefix), active)) == want
    # confident drafts pay for a large tree; hopeless ones for none
    assert lines.candidates[int(pick(np.zeros((4, 256), np.float32), 512.0, np.ones(4, bool)))] == 256
    assert lines.candidates[int(pick(np.full((4, 256), -20.0, np.float32), 512.0, np.ones(4, bool)))] == "ar"


def test_per_row_choice_and_the_replay_picker():
    logp = np.log(np.array([[0.99] * 16, [0.01] * 16, [0.9, 0.8, 0.7, 0.6] + [0.001] * 12], np.float32))
    logp[2, 10:] = -np.inf
    cands, ms = ("ar", 4, 16), np.array([1.0, 1.5, 3.0], np.float32)
    want = [int(np.argmax(brute_force(logp[i:i + 1], cands, ms, [True], None))) for i in range(3)]
    assert want == [2, 0, 1]
    np.testing.assert_array_equal(cost.choose_budget_np(logp, cands, ms, per_row=True), want)
    np.testing.assert_array_equal(cost.choose_budget(jnp.asarray(logp), cands, ms, per_row=True), want)
    np.testing.assert_array_equal(cost.choose_budget_np(logp, cands, ms, np.array([True, True, False]),
                                                        per_row=True), [2, 0, 0])
    pick = cost.budget_picker(cands, ms)
    np.testing.assert_array_equal(pick(logp), [16, 0, 4])
    with pytest.raises(ValueError, match="leave out"):
        cost.budget_picker(("dflash", 4), [1.0, 2.0])
    with pytest.raises(ValueError, match="one cost per candidate"):
        cost.budget_picker((4, 16), [1.0])


# -- bench fit-cost ------------------------------------------------------------------------------


SHIPPED_8B = json.loads(next(cost.SHIPPED_DIR.glob("h100*qwen3-8b*.json")).read_text())["model"]


def round_json(device="NVIDIA H100 80GB HBM3", rows=(), **extra) -> dict:
    base = dict(attn_impl="auto", matmul_impl="auto", cache_impl="auto", drafter_quant="none", draft_vocab=None,
                policy="ddtree")
    return dict(model="qwen3-8b", dtype="bfloat16", device=device, batch=[1, 4], signature=SHIPPED_8B,
                rows=[{**base, **r} for r in rows], **extra)


def row(method, batch, nodes, prompt_len, call, steady=None):
    return dict(method=method, batch=batch, nodes=nodes, budget=nodes, prompt_len=prompt_len,
                round_ms_median=call, round_ms_steady=steady or call - 0.1)


def test_fit_from_bench_round_json(tmp_path, capsys):
    from bench import fit_cost

    a = round_json(rows=[row("ar", 1, 0, 512, 5.0), row("dflash", 1, 15, 512, 7.0), row("ddtree", 1, 64, 512, 8.0),
                         row("ddtree", 1, 256, 512, 10.0), row("ddtree", 4, 64, 512, 11.0),
                         row("ddtree", 4, 256, 512, 20.0)], errors=["P=512 x8 ddtree B=256: OOM"])
    # measured again, and a --budgets auto row: a mix of its candidates' costs, left out
    b = round_json(rows=[row("ddtree", 1, 64, 512, 8.4), row("ddtree", 1, 64, 512, 8.2),
                         dict(row("ddtree", 1, 256, 512, 1.0), budget="auto")])
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    out = tmp_path / "cost.json"
    assert fit_cost.main([str(fa), str(fb), "--out", str(out), "--source", "commit abc"]) == 0
    printed = capsys.readouterr().out
    assert "1 rows failed and are left out" in printed and "ddtree batch 4: budgets 64..256" in printed
    cm = cost.load_cost_model(out, device_kind=H100, model=ModelSignature(**SHIPPED_8B))
    assert cm.round_ms(64, 1, 512) == pytest.approx(8.2)  # the median of 8.0, 8.4, 8.2
    assert cm.round_ms(160, 2, 512) == pytest.approx((9.1 * 2 + 15.5) / 3)
    assert cm.round_ms("dflash", 1, 512) == 7.0 and not cm.covers("dflash", 4)
    assert "a.json, b.json" in cm.source and cm.source.endswith("commit abc")
    assert fit_cost.main([str(fa), "--out", str(out), "--metric", "steady"]) == 0
    assert cost.load_cost_model(out).round_ms("ar", 1, 512) == pytest.approx(4.9)


@pytest.mark.parametrize("data,want,pair", [
    (round_json(rows=[row("ar", 1, 0, 512, 5.0)], device="NVIDIA H200"), r"b.json was measured on NVIDIA H200 .*"
                                                                         r"a.json on NVIDIA H100.*one device", True),
    (dict(round_json(rows=[row("ar", 1, 0, 512, 5.0)]), signature=dict(SHIPPED_8B, layers=2)),
     r"b.json records another model shape", True),
    ({"rows": []}, r"lacks the strings device, model and dtype", False),
    (round_json(rows=[{"method": "ar"}]), r"rows\[0\] lacks one of method, batch, nodes, prompt_len", False),
    (round_json(rows=[dict(row("ar", 1, 0, 512, 5.0), attn_impl="xla")]), r"attn_impl='xla'.*without that flag", False),
    (round_json(rows=[dict(row("ddtree", 1, 8, 512, 5.0), policy="chain")]), r"the 'chain' policy", False),
    (round_json(rows=[row("ar", 1, 0, 512, -1.0)]), r"round_ms_median is -1.0; remeasure", False),
    (dict(round_json(rows=[row("ar", 1, 0, 512, 5.0)]), model="qwen9", signature=None),
     r"model 'qwen9' is not one of", False),
    (dict(round_json(rows=[row("ar", 1, 0, 512, 5.0)]), signature={"layers": 2}),
     r"signature is .*not a model shape", False),
    (round_json(rows=[row("ar", 1, 3, 512, 5.0)]), r"point \d \(ar\) has nodes 3; ar verifies 0 nodes", False),
])
def test_fit_refuses_bad_bench_round_json_in_one_line(tmp_path, capsys, data, want, pair):
    from bench import fit_cost

    good = tmp_path / "a.json"
    good.write_text(json.dumps(round_json(rows=[row("ar", 1, 0, 512, 5.0)])))
    bad = tmp_path / "b.json"
    bad.write_text(json.dumps(data))
    files = [good, bad] if pair else [bad]
    code = cli_main(fit_cost.main, [*map(str, files), "--out", str(tmp_path / "c.json")], prog="fit-cost")
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and re.search(want, err), err
    assert not (tmp_path / "c.json").exists()


def test_fit_cost_is_a_bench_command_and_needs_files_or_measure(tmp_path, capsys):
    from bench.__main__ import available, main

    assert available()["fit-cost"] == "bench.fit_cost"
    assert cli_main(main, ["fit-cost", "--out", str(tmp_path / "c.json")], prog="bench") == 2
    assert "give bench round JSON files or --measure" in capsys.readouterr().err


def test_fit_cost_measure_on_the_tiny_shape(tmp_path):
    """--measure runs bench round over batches x methods (several batches in one bench round run)."""
    from bench import fit_cost

    out = tmp_path / "cost.json"
    assert fit_cost.main(["--measure", "--model", "tiny", "--dtype", "float32", "--batches", "1,2", "--methods",
                          "ddtree", "--budgets", "2", "--prompt-lens", "16", "--rounds", "2", "--repeats", "1",
                          "--out", str(out)]) == 0
    raw = json.loads((tmp_path / "round_tiny_auto_b1_2.json").read_text())
    assert raw["batch"] == [1, 2] and [(r["method"], r["batch"]) for r in raw["rows"]] == [("ddtree", 1), ("ddtree", 2)]
    # the shape bench round records from its configs (ModelSignature.of) is its shape table's
    cm = cost.load_cost_model(out, model=fit_cost.signature("tiny", "float32", "x"))
    assert cm.candidates(2) == (2,) and cm.round_ms(2, 2, 16) > 0


# -- the projection ------------------------------------------------------------------------------


def test_projection_numbers_on_a_tiny_input(tmp_path):
    from bench import projection

    cm = CostModel("Test GPU", SIG, (
        Point("ar", 1, 0, 512, 5.0), Point("ar", 16, 0, 512, 6.0),
        Point("dflash", 1, 7, 512, 8.0), Point("dflash", 16, 7, 512, 10.0),
        Point("ddtree", 1, 16, 512, 8.0), Point("ddtree", 1, 64, 512, 9.0), Point("ddtree", 16, 64, 512, 30.0)))
    acc = {"dflash": 3.0, "16": 4.0, "64": 5.0, "auto": {"1": {"tokens": 4.8, "choices": {"64": 0.5, "16": 0.5}},
                                                        "16": {"tokens": 3.2, "choices": {"dflash": 1}}}}
    proj = projection.project(cm, acc, batches=[1, 16, 32])
    s = proj["series"]
    assert list(s) == ["AR", "DFlash", "DDTree-16", "DDTree-64", "auto"]
    assert s["AR"]["tokens_per_s"][:2] == pytest.approx([200.0, 16000 / 6.0])
    assert s["AR"]["tokens_per_s"][2] is None  # batch 32 is not covered: left out
    assert s["DDTree-64"]["tokens_per_s"][:2] == pytest.approx([5000 / 9.0, 16 * 5000 / 30.0])
    assert s["DDTree-16"]["tokens_per_s"][1] is None
    assert s["auto"]["round_ms"][:2] == pytest.approx([8.5, 10.0])
    assert s["auto"]["tokens_per_s"][:2] == pytest.approx([4800 / 8.5, 16 * 3200 / 10.0])
    assert proj["best"][:2] == ["DDTree-64", "DFlash"]
    assert proj["auto_over_best"][:2] == pytest.approx([(4800 / 8.5) / (5000 / 9.0), 3.2 / 3.0])
    text = projection.table(proj)
    assert "| DDTree-64 | 556 | 2667 | - |" in text and "| auto / best fixed | 1.016x | 1.067x | - |" in text
    assert projection.plot(proj, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    for bad, want in [({"dflash": 0.5}, "dflash is 0.5"), ({"chain": 3}, "'chain' is not"),
                      ({"auto": {"1": {"tokens": 2, "choices": {"64": 0.5}}}}, "summing to 1"),
                      ({"auto": {"x": {}}}, "batch size >= 1")]:
        with pytest.raises(Exception, match=want):
            projection.project(cm, bad)
