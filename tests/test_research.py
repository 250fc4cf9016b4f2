"""Offline policy replay (ddtree_jax.research): a record of the shipped pair replays the engine's
greedy rounds exactly, every registered policy reads no rank past the record's top-K, and the
command line refuses bad input with one line and writes nothing partial."""
from __future__ import annotations

import json
import lzma
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from ddtree_jax.checkpoint import DEFAULT_CKPT, load_checkpoint
from ddtree_jax.errors import cli_main
from ddtree_jax.generator import Executables, Generator
from ddtree_jax.kernels.chunk_topk import top_k_total_order
from ddtree_jax.research import store
from ddtree_jax.research.__main__ import main as research_main
from ddtree_jax.research.record import make_header, record_greedy
from ddtree_jax.research.simulate import BatchBudget, auto_budget, ranks_needed, replay
from ddtree_jax.research.store import Record, load_record, save_record
from ddtree_jax.trees import available_policies, make_policy
from ddtree_jax.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parent.parent
EVAL_PROMPTS = ROOT / "bench" / "data" / "eval_prompts.jsonl.xz"
NEW_TOKENS = 48
# The policies and budgets the engine is compared at. Where two give one tree (chain: min(budget, D)
# nodes; beam:width=4: min(budget, 4 D)), the engine runs it once and both replays must equal it.
SETTINGS = [("chain", 16), ("chain", 64), ("chain", 256), ("ddtree", 16), ("ddtree", 64), ("ddtree", 256),
            ("beam", 64), ("beam", 256)]


def cli(*args) -> int:
    return cli_main(research_main, [str(a) for a in args], prog="research")


@pytest.fixture(scope="module")
def shipped():
    return load_checkpoint(DEFAULT_CKPT, dtype="float32")


@pytest.fixture(scope="module")
def prompts(shipped):
    tok = load_tokenizer(shipped.tokenizer_dir)
    with lzma.open(EVAL_PROMPTS, "rt") as f:
        texts = [row["text"] for row in map(json.loads, f)][:3]
    return [tok.encode(t, add_special_tokens=False)[:40 + 12 * i] for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def executables():
    return Executables()  # the prefill compiles once for every engine run here


@pytest.fixture(scope="module")
def recorded(shipped, prompts, executables, tmp_path_factory):
    """The record of the three prompts, written and read back."""
    gen = Generator(shipped, method="ddtree", policy="ddtree", budget=16, executables=executables)
    outputs, logp, ids = record_greedy(gen, prompts, NEW_TOKENS, 256, batch_size=3)
    header = make_header(ckpt_dir=DEFAULT_CKPT, gen=gen, top_k=256, max_new_tokens=NEW_TOKENS, stop_ids=[0],
                         sources=["a", "b", "c"])
    path = save_record(tmp_path_factory.mktemp("record") / "rec.npz", header, prompts, outputs, logp, ids)
    return path, load_record(path)


def test_replay_equals_the_engine_round_for_round(shipped, prompts, executables, recorded):
    _, rec = recorded
    depth = shipped.drafter_cfg.depth
    engine_runs: dict = {}
    compared = 0
    for name, budget in SETTINGS:
        tree = (name, make_policy(name).num_nodes(budget, depth))
        if tree not in engine_runs:
            gen = Generator(shipped, method="ddtree", policy=name, budget=budget, executables=executables)
            res = gen.generate_ids(prompts, max_new_tokens=NEW_TOKENS)
            for r, out in zip(res, rec.outputs):
                assert r.token_ids == out[:NEW_TOKENS].tolist(), "the record's greedy output is not the engine's"
            engine_runs[tree] = [r.acceptance_lengths for r in res]
        got = replay(rec, name, budget, stop=False)
        assert [p.acceptance_lengths for p in got.prompts] == engine_runs[tree], (name, budget)
        compared += got.rounds
    assert len(engine_runs) == 5 and compared > len(SETTINGS) * 3 * 8  # several rounds a prompt everywhere


def test_a_budget_function_prunes_the_best_first_tree(recorded):
    """Keeping the first 16 slots of DDTree-32's best-first tree is DDTree-16, round for round; the
    function sees each tree's path log-probs, best first."""
    _, rec = recorded
    seen = []

    def keep16(path_logp):
        seen.append(path_logp)
        return np.full(path_logp.shape[0], 16)

    pruned = replay(rec, "ddtree", keep16, max_budget=32, stop=False)
    assert [p.acceptance_lengths for p in pruned.prompts] == [
        p.acceptance_lengths for p in replay(rec, "ddtree", 16, stop=False).prompts]
    assert pruned.budget == "auto" and pruned.mean_nodes == 16
    path_logp = np.concatenate(seen)
    assert path_logp.shape[1] == 32 and np.all(np.diff(path_logp, axis=1) <= 0)


def _record(outputs, logp, ids, *, stop_ids=(), fingerprint="f" * 24) -> Record:
    p, n, d, k = logp.shape
    header = {"format": store.FORMAT, "checkpoint": {"path": "x", "fingerprint": fingerprint}, "block_size": d + 1,
              "depth": d, "vocab_size": 100, "top_k": k, "max_new_tokens": n + 1, "stop_ids": list(stop_ids)}
    return Record(header, [np.arange(3, dtype=np.int32)] * p, outputs, logp, ids)


def test_the_hop_commits_and_stops_as_the_engine():
    """A chain of depth 2 over a sequence the drafter always guesses right commits 3 tokens a
    round; a stop id among a round's tokens ends the prompt after that round, and a stop as the
    first token ends it before any round."""
    d, n = 2, 10
    outputs = np.arange(10, 10 + n + d, dtype=np.int32)[None].repeat(3, 0)
    outputs[1, 4] = 7           # emitted by the second round (outputs 4..6)
    outputs[2, 0] = 7           # the prefill's token
    logp = np.zeros((3, n - 1, d, 1), np.float32)
    ids = np.stack([outputs[:, 1 + j:1 + j + d] for j in range(n - 1)], axis=1)[..., None]
    rec = _record(outputs, logp, ids, stop_ids=[7])
    res = replay(rec, "chain", 2)
    assert [p.acceptance_lengths for p in res.prompts] == [[3, 3, 3], [3, 3], []]
    assert replay(rec, "chain", 2, stop=False).prompts[2].acceptance_lengths == [3, 3, 3]
    assert replay(rec, "chain", 2, max_new_tokens=4).prompts[0].acceptance_lengths == [3]
    assert res.histogram == [0, 0, 5] and res.mean_acceptance == 3.0


def _registered_policies():
    out = [make_policy("beam:width=32")]  # a beam wider than the budget: its top `budget` ranks only
    for name in available_policies():
        try:
            out.append(make_policy(name))
        except ValueError:  # needs an option: static
            out.append(make_policy(f"{name}:tree=0;1;0.0;0.1;2;1.0;0.0.0"))
    return out


@pytest.mark.parametrize("policy", _registered_policies(), ids=lambda p: p.spec)
def test_every_policy_reads_no_rank_past_ranks_needed(policy):
    """A policy built over the top `ranks_needed` tokens a depth (their ids mapped back, as replay
    does) gives the tree it gives over the whole vocabulary. Log-probs on a coarse grid: many
    ties, which the top-K order must break as the full one does."""
    rng = np.random.default_rng(0)
    batch, depth, vocab = 6, 5, 300
    logp = jax.nn.log_softmax(np.round(rng.normal(size=(batch, depth, vocab)) * 4) / 2, axis=-1)
    for budget in (3, 24):
        need = ranks_needed(policy, budget, depth)
        build = jax.jit(lambda x: policy.build(x, budget))
        full = build(logp)
        vals, idx = top_k_total_order(logp, need)
        cut = build(vals)
        flat = (np.asarray(cut.depths) - 1).clip(0) * need + np.asarray(cut.tokens)
        tokens = np.take_along_axis(np.asarray(idx).reshape(batch, -1), flat, axis=1)
        valid = np.asarray(full.valid)
        assert np.array_equal(valid, np.asarray(cut.valid)), budget
        assert np.array_equal(np.where(valid, tokens, -1)[:, 1:], np.where(valid, full.tokens, -1)[:, 1:]), budget
        assert np.array_equal(full.parents, cut.parents) and np.array_equal(full.depths, cut.depths), budget


@pytest.fixture()
def small_record(tmp_path):
    """A record of made-up drafts (depth 3, top-8), written to a file."""
    rng = np.random.default_rng(1)
    p, n, d, k = 2, 12, 3, 8
    logp = -np.sort(rng.random((p, n - 1, d, k)).astype(np.float32), axis=-1) * 5
    ids = np.stack([rng.permutation(50)[:k] for _ in range(p * (n - 1) * d)]).reshape(p, n - 1, d, k)
    rec = _record(rng.integers(0, 50, (p, n + d)).astype(np.int32), logp, ids.astype(np.uint16))
    path = tmp_path / "small.npz"
    save_record(path, rec.header, rec.prompts, rec.outputs, rec.logp, rec.ids)
    return path


def _one_error_line(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_bad_records_and_flags_are_one_line_and_exit_2(tmp_path, small_record, capsys):
    assert cli("replay", tmp_path / "none.npz") == 2
    _one_error_line(capsys, "not found")
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    assert cli("replay", tmp_path / "bad.npz") == 2
    _one_error_line(capsys, "not a readable research record")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    assert cli("replay", tmp_path / "other.npz") == 2
    _one_error_line(capsys, "not a research record")
    assert cli("replay", small_record, "--ckpt", DEFAULT_CKPT) == 2
    _one_error_line(capsys, "was made with checkpoint", "record it again")
    assert cli("replay", small_record, "--tree-policy", "nope") == 2
    _one_error_line(capsys, "unknown tree policy 'nope'")
    assert cli("replay", small_record, "--budget", "4,16") == 2
    _one_error_line(capsys, "--top-k 16")
    assert cli("replay", small_record, "--budget", "x") == 2
    _one_error_line(capsys, "--budget")
    assert cli("record", "--out", tmp_path / "r.npz", "--top-k", "0") == 2
    _one_error_line(capsys, "--top-k")
    assert cli("record", "--out", tmp_path / "r.npz", "--ckpt", tmp_path / "nockpt") == 2
    _one_error_line(capsys, "not found")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.npz", "other.npz", "small.npz"]


def test_the_command_line_contract(tmp_path):
    """As a process: exit code 2 and one line on stderr that says what to do."""
    proc = subprocess.run([sys.executable, "-m", "ddtree_jax.research", "replay", str(tmp_path / "none.npz")],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "python -m ddtree_jax.research record" in proc.stderr


def test_outputs_are_never_overwritten_without_force(tmp_path, small_record, capsys):
    before = small_record.read_bytes()
    assert cli("record", "--out", small_record) == 2
    _one_error_line(capsys, "already exists", "--force")
    png = tmp_path / "acc.png"
    png.with_suffix(".csv").write_text("mine\n")
    assert cli("plot", small_record, "--out", png) == 2
    _one_error_line(capsys, "already exists")
    assert small_record.read_bytes() == before and png.with_suffix(".csv").read_text() == "mine\n"
    assert not png.exists()


def test_a_record_is_written_whole_or_not_at_all(tmp_path, small_record, monkeypatch):
    rec = load_record(small_record)
    before = small_record.read_bytes()

    def interrupted(f, **arrays):
        f.write(b"PK partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(store.np, "savez_compressed", interrupted)
    for target, force in ((tmp_path / "new.npz", False), (small_record, True)):
        with pytest.raises(KeyboardInterrupt):
            save_record(target, rec.header, rec.prompts, rec.outputs, rec.logp, rec.ids, force=force)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.npz"]
    assert small_record.read_bytes() == before


def test_replay_json_and_plot(tmp_path, small_record, capsys):
    assert cli("replay", small_record, "--tree-policy", "chain", "--tree-policy", "beam:width=2", "--budget", "3,4",
               "--json") == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["policy"], r["budget"]) for r in rows] == [("chain", 3), ("chain", 4), ("beam:width=2", 3),
                                                          ("beam:width=2", 4)]
    assert rows[0] == rows[1] | {"budget": 3}  # the chain is D = 3 nodes long at either budget
    assert all(sum(r["histogram"]) == r["rounds"] == sum(p["rounds"] for p in r["prompts"]) for r in rows)
    png = tmp_path / "acc.png"
    assert cli("plot", small_record, "--out", png, "--budgets", "1,16") == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = png.with_suffix(".csv").read_text().splitlines()
    plotted = json.loads(png.with_suffix(".json").read_text())["rows"]
    # ddtree at 16 needs top-16 (the record keeps 8): left out, and said so
    assert len(table) == 1 + len(plotted) and {(r["policy"], r["budget"]) for r in plotted} == {
        ("beam:width=4", 1), ("beam:width=4", 16), ("chain", 1), ("chain", 16), ("ddtree", 1)}
    assert "left out" in capsys.readouterr().err


def test_budget_auto_in_the_engine_equals_its_replay(shipped, prompts, executables, recorded):
    """`--budget auto` at batch 1 picks, each round, what cost.budget_picker picks from the same
    path log-probs at the same costs: the engine's rounds equal the replay's, round for round,
    and the picks vary (the costs are close enough that no candidate always wins)."""
    from ddtree_jax.cost import CostModel, ModelSignature, Point, budget_picker

    _, rec = recorded
    costs = {16: 8.0, 64: 9.0, 256: 10.0}  # ms a round at every prefix (flat), batch 1
    sig = ModelSignature.of(shipped.target_cfg, shipped.drafter_cfg, shipped.target_params["embed"].dtype)
    cm = CostModel("cpu", sig, tuple(Point("ddtree", 1, n, 64, ms) for n, ms in costs.items()))
    gen = Generator(shipped, method="ddtree", budget="auto", cost_model=cm, auto_budgets=tuple(costs),
                    executables=executables)
    want = replay(rec, "ddtree", budget_picker(tuple(costs), list(costs.values())), max_budget=256, stop=False)
    for prompt, replayed in zip(prompts, want.prompts):
        [res] = gen.generate_ids([prompt], max_new_tokens=NEW_TOKENS)
        assert res.acceptance_lengths == replayed.acceptance_lengths
    picks = {n for p in want.prompts for n in p.nodes}
    assert len(picks) >= 2, picks


def _close_costs(shipped, batch: int):
    """A cost model at `batch` whose candidates cost close enough that the picks vary: DFlash and
    DDTree-16 flat, DDTree-64 and -256 dearer as the prefix grows (the rows' mean length counts)."""
    from ddtree_jax.cost import CostModel, ModelSignature, Point

    sig = ModelSignature.of(shipped.target_cfg, shipped.drafter_cfg, shipped.target_params["embed"].dtype)
    ms = {"dflash": (7.0, 7.0), 16: (8.0, 8.0), 64: (8.8, 9.2), 256: (9.6, 10.6)}  # at prefix 32, 128
    return CostModel("cpu", sig, tuple(Point("dflash" if c == "dflash" else "ddtree", batch,
                                             shipped.drafter_cfg.depth if c == "dflash" else c, prefix, v[i])
                                       for c, v in ms.items() for i, prefix in enumerate((32, 128))))


def test_budget_auto_at_batch_3_in_the_engine_equals_its_lockstep_replay(shipped, prompts, executables, recorded):
    """`--budget auto` on a batch of the three prompts makes one choice a round over the rows
    still running, at the costs of batch 3 after their mean length: the replay in lockstep at
    batch 3 gives every row's rounds exactly, and picks DFlash's chain and several tree sizes."""
    _, rec = recorded
    cm = _close_costs(shipped, 3)
    gen = Generator(shipped, method="ddtree", budget="auto", cost_model=cm, auto_budgets=(16, 64, 256),
                    executables=executables)
    got = gen.generate_ids(prompts, max_new_tokens=NEW_TOKENS)
    want = replay(rec, "ddtree", auto_budget(cm, (16, 64, 256)), batch=3, stop=False)
    assert [r.acceptance_lengths for r in got] == [p.acceptance_lengths for p in want.prompts]
    assert "dflash" in want.choices and len(want.choices) >= 3, want.choices
    assert abs(sum(want.choices.values()) - 1) < 1e-9 and 7.0 <= want.mean_round_ms <= 10.6
    # rows of one batch share each round's pick
    for step in range(min(p.rounds for p in want.prompts)):
        assert len({p.picks[step] for p in want.prompts}) == 1


class _Always(BatchBudget):
    """Picks `pick` every round; keeps what each call saw."""

    def __init__(self, cands, pick):
        self.cands, self.pick, self.calls = cands, pick, []

    def candidates(self, batch):
        return self.cands

    def choose(self, path_logp, chain_logp, active, prefix):
        self.calls.append((path_logp, chain_logp, active, prefix))
        return self.cands.index(self.pick)


def test_a_batch_budget_chooses_for_its_batch_rows_together():
    """In lockstep at batch 2 over three prompts (batches [0, 1] and [2]): a batch budget that
    always picks one candidate is that fixed budget (DFlash: the chain) round for round; each call
    sees its batch's rows, a finished row inactive with no nodes, and the active rows' mean length
    (prompt + outputs before the root)."""
    rng = np.random.default_rng(3)
    p, n, d, k = 3, 11, 3, 8
    outputs = rng.integers(0, 50, (p, n + 1 + d)).astype(np.int32)
    logp = -np.sort(rng.random((p, n, d, k)).astype(np.float32), axis=-1) * 5
    ids = np.stack([rng.permutation(50)[:k] for _ in range(p * n * d)]).reshape(p, n, d, k)
    for j in range(n):  # the drafter's top-1 is always right for prompt 0: it finishes first
        for depth in range(d):
            row = ids[0, j, depth]
            true = outputs[0, j + 1 + depth]
            ids[0, j, depth] = np.concatenate([[true], row[row != true]])[:k]
    rec = _record(outputs, logp, ids.astype(np.uint16))
    rec.prompts[:] = [np.arange(m, dtype=np.int32) for m in (3, 5, 7)]
    for pick, fixed in ((2, ("ddtree", 2)), (8, ("ddtree", 8)), ("dflash", ("chain", d))):
        budget = _Always((2, 8, "dflash"), pick)
        got = replay(rec, "ddtree", budget, batch=2, stop=False)
        want = replay(rec, *fixed, stop=False)
        assert [q.acceptance_lengths for q in got.prompts] == [q.acceptance_lengths for q in want.prompts], pick
        assert [q.nodes for q in got.prompts] == [q.nodes for q in want.prompts], pick
        assert got.choices == {pick: 1.0} and got.budget == "auto" and got.batch == 2
    rounds = [q.acceptance_lengths for q in want.prompts]
    assert len(rounds[0]) < len(rounds[1])
    expect = []
    for step in range(max(map(len, rounds))):
        for group in ([0, 1], [2]):
            active = [step < len(rounds[i]) for i in group]
            if any(active):
                lengths = [len(rec.prompts[i]) + sum(rounds[i][:step]) for i, a in zip(group, active) if a]
                expect.append((active, np.mean(lengths)))
    assert len(budget.calls) == len(expect)
    for (path, chain, active, prefix), (want_active, want_prefix) in zip(budget.calls, expect):
        assert active.tolist() == want_active and prefix == pytest.approx(want_prefix)
        assert path.shape == (len(active), 8) and chain.shape == (len(active), d)
        assert np.isneginf(path[~active]).all() and np.isfinite(path[active]).all()
        assert np.isneginf(chain[~active]).all() and np.all(np.diff(chain[active], axis=1) <= 0)


def test_replay_budget_auto_on_the_command_line(tmp_path, small_record, capsys):
    """--budget auto needs --cost-model (one line, exit 2); with one it reports the share of
    rounds at each candidate and the modelled ms a round."""
    from ddtree_jax.cost import CostModel, ModelSignature, Point

    assert cli("replay", small_record, "--budget", "auto") == 2
    _one_error_line(capsys, "--cost-model")
    assert cli("replay", small_record, "--budget", "4", "--cost-model", tmp_path / "none.json") == 2
    _one_error_line(capsys, "--budget auto")
    sig = ModelSignature(1, 8, 16, 1, 1, 8, 100, "float32", 1, 4)  # block size 4: the record's depth 3 + 1
    cm = CostModel("cpu", sig, (Point("dflash", 2, 3, 16, 5.0), Point("ddtree", 2, 4, 16, 6.0),
                                Point("ddtree", 2, 8, 16, 7.0)))
    cm.save(tmp_path / "cost.json")
    assert cli("replay", small_record, "--budget", "auto", "--cost-model", tmp_path / "cost.json", "--batch", "1") == 2
    _one_error_line(capsys, "covers none", "batch 1")
    assert cli("replay", small_record, "--budget", "auto,4", "--cost-model", tmp_path / "cost.json",
               "--auto-budgets", "4,8", "--batch", "2", "--json") == 0
    auto, four = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert auto["budget"] == "auto" and auto["batch"] == 2 and set(auto["choices"]) <= {"dflash", "4", "8"}
    assert abs(sum(auto["choices"].values()) - 1) < 1e-9 and 5.0 <= auto["mean_round_ms"] <= 7.0
    assert four["budget"] == 4 and "choices" not in four
    assert cli("replay", small_record, "--budget", "auto", "--cost-model", tmp_path / "cost.json",
               "--auto-budgets", "4,8", "--batch", "2") == 0
    assert "modelled ms a round" in capsys.readouterr().out
