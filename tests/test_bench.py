"""`python -m bench` (the suite) end to end on the shipped pair (tiny matrix), its JSON and plots, the
torch baseline, the losslessness bookkeeping, the shipped eval prompts, the command dispatcher, and
the error contract (exit 2, one line, no traceback)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_jax.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = ("acceptance_vs_budget.png", "speedup_vs_budget.png", "stage_breakdown.png", "acceptance_hist.png")


def test_suite_end_to_end_on_the_shipped_pair(tmp_path):
    from bench.suite import main

    out = tmp_path / "run"
    rc = main(["--num-prompts", "2", "--prompt-tokens", "32", "--max-new-tokens", "8", "--methods", "ar,ddtree",
               "--policies", "ddtree", "--budgets", "4", "--temperatures", "0", "--repeats", "1",
               "--profile-prompts", "0", "--torch-baseline", "--no-progress", "--compile-workers", "2",
               "--time-limit", "3600", "--out", str(out)])
    assert rc == 0
    bench = json.loads((out / "bench.json").read_text())
    # every row compiled in the compile phase (two threads) and none in its own run
    assert bench["compile_ahead"]["rows"] == 2 and bench["compile_ahead"]["compiles"] > 0
    assert [r["row_timing"]["compiles"] for r in bench["runs"]] == [0, 0]
    assert all(r["row_timing"]["timed_generate_s"] <= r["row_timing"]["timed_s"] for r in bench["runs"])
    for key in ("schema", "config", "environment", "prompts", "runs", "all_lossless", "torch_baseline"):
        assert key in bench, key
    for key in ("jax", "platform", "device_kind", "commit", "date"):
        assert key in bench["environment"], key
    assert [p["num_tokens"] for p in bench["prompts"]] == [32, 32]
    runs = {r["method"]: r for r in bench["runs"]}
    assert set(runs) == {"ar", "ddtree"} and bench["all_lossless"]
    for r in runs.values():
        for key in ("tokens_per_s", "mean_acceptance", "acceptance_histogram", "time_per_round_ms", "stage_ms",
                    "speedup_vs_ar", "overhead_fraction", "per_prompt", "lossless"):
            assert key in r, key
        assert r["lossless"] is True and r["tokens_per_s"]["median"] > 0 and len(r["per_prompt"]) == 2
        assert all(p["num_output_tokens"] == 8 for p in r["per_prompt"])
        assert sum(r["acceptance_histogram"]) == r["rounds"]
    assert runs["ar"]["mean_acceptance"] == 1.0 and runs["ar"]["speedup_vs_ar"] == 1.0
    assert runs["ddtree"]["budget"] == 4 and runs["ddtree"]["mean_acceptance"] >= 1.0
    # the profiled pass compiles every stage again (~15 s here): test_run_config_bookkeeping covers it
    assert runs["ddtree"]["stage_ms"] is None and runs["ddtree"]["overhead_fraction"] is None
    tb = bench["torch_baseline"]
    assert tb["tokens_per_s"]["median"] > 0 and tb["equal_to_jax_ar"].endswith("/2")
    assert tb["cache_implementation"] in ("static", "default (dynamic)")
    assert tb["device"] == "cpu" and tb["device_name"] == "cpu"  # auto, and this torch sees no GPU
    assert "partial" not in bench and "not_run" not in bench
    assert "| ddtree | ddtree | 4 |" in (out / "summary.md").read_text()
    for name in PLOTS:
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, name


class _FakeGenerator:
    """Generator's interface with canned results: run_config's bookkeeping without compiling."""

    method, policy_name, budget = "ddtree", "ddtree", 8
    dcfg = type("D", (), {"depth": 4})()
    policy = type("P", (), {"num_nodes": staticmethod(lambda b, d: b)})()

    def __init__(self):
        self.calls = []

    def generate_ids(self, prompts, *, max_new_tokens, seed, profile=False, **kw):
        from ddtree_jax.generator import Result

        self.calls.append((seed, profile))
        acc = [3, 5, 1] if seed % 2 == 0 else [2, 2]
        stage = {"draft": 1.0, "tree": 0.5, "verify": 2.0, "walk": 0.1, "commit": 0.4} if profile else None
        return [Result(token_ids=list(range(sum(acc))), num_output_tokens=sum(acc), time_s=0.5 + 0.1 * len(self.calls),
                       tokens_per_s=0.0, rounds=len(acc), acceptance_lengths=acc, mean_acceptance=sum(acc) / len(acc),
                       prefill_s=0.1, stage_ms=stage)]


def test_run_config_bookkeeping(tmp_path):
    from bench.plots import draw_all
    from bench.prompts import Prompt
    from bench.suite import SuiteOptions, compare_with_baseline, run_config

    gen = _FakeGenerator()
    prompts = [Prompt(0, "a", (1, 2)), Prompt(1, "b", (3,))]
    row = run_config(gen, prompts, 0.0, SuiteOptions(max_new_tokens=9, repeats=2, seed=10, profile_prompts=1))
    # one warm-up, 2 repeats x 2 prompts, one profiled prompt
    assert gen.calls == [(10, False), (10, False), (11, False), (10, False), (11, False), (10, True)]
    assert row["output_tokens"] == 13 and row["rounds"] == 5
    assert row["mean_acceptance"] == pytest.approx(13 / 5)
    assert row["acceptance_histogram"] == [1, 2, 1, 0, 1]  # lengths 1..depth+1
    assert row["tokens_per_s"]["n"] == 2 and row["tokens_per_s"]["min"] < row["tokens_per_s"]["max"]
    assert row["stage_ms"]["verify"] == pytest.approx(2.0)
    assert row["overhead_fraction"] == pytest.approx(2.0 / 4.0)
    assert len(row["per_prompt"]) == 2 and row["per_prompt"][1]["time_s"]["n"] == 2
    tm = row["row_timing"]
    assert tm["compiles"] == 0 and tm["row_s"] >= tm["warmup_s"] + tm["timed_s"] + tm["profile_s"] - 1e-6
    assert tm["timed_generate_s"] == pytest.approx(sum(0.5 + 0.1 * k for k in range(2, 6)))
    compare_with_baseline(row, row)
    assert row["lossless"] is True and row["speedup_vs_ar"] == 1.0
    from bench.suite import summary_line

    assert "| row " in summary_line(row) and "compile 0.0s (0)" in summary_line(row)
    # the plots draw stacked stages and histograms from such rows
    for name in draw_all({"runs": [row], "environment": {"device_kind": "fake"}}, tmp_path):
        data = name.read_bytes()
        assert data[:8] == PNG and len(data) > 5000, name


def test_run_config_verify_loop(monkeypatch):
    """--verify-loop: the row's verify pass alone (a device loop) against its timed fused rounds."""
    from bench import suite
    from bench.prompts import Prompt

    seen = []
    monkeypatch.setattr(suite, "verify_alone_ms", lambda gen, n, t, opts: seen.append((n, t)) or 1.0)
    prompts = [Prompt(0, "a", (1, 2)), Prompt(1, "b", (3,))]
    row = suite.run_config(_FakeGenerator(), prompts, 0.5, suite.SuiteOptions(max_new_tokens=9, repeats=1,
                                                                             profile_prompts=0, verify_loop=True))
    assert seen == [(2, 0.5)] and row["verify_alone_ms"] == 1.0
    assert row["overhead_beyond_verify"] == pytest.approx(1 - 1.0 / row["time_per_round_ms"]["median"])
    row.update(speedup_vs_ar=1.0, lossless=None)
    assert f"| 1.00 | {100 * row['overhead_beyond_verify']:.0f}% |" in suite.markdown_table([row])


def test_verify_alone_on_the_tiny_pair_sampled():
    """verify_alone_ms compiles and runs the sampled verify pass in a device loop."""
    import math

    from bench.suite import SuiteOptions, verify_alone_ms
    from ddtree_jax.generator import Generator
    from tiny import tiny_pair

    gen = Generator(tiny_pair(vocab=64, layers=2), method="ddtree", budget=4)
    ms = verify_alone_ms(gen, 8, 1.0, SuiteOptions(max_new_tokens=16, top_p=0.9), rounds=2, repeats=1)
    assert math.isfinite(ms)


def test_lossless_check_flags_a_mismatch():
    from bench.suite import compare_with_baseline, first_mismatch

    def row(tokens, t=0.0):
        return {"temperature": t, "tokens_per_s": {"median": 10.0}, "_tokens": tokens,
                "per_prompt": [{"prompt": i, "tokens_per_s": 10.0} for i in range(len(tokens))]}

    base = row([[1, 2, 3], [4, 5]])
    bad = row([[1, 2, 3], [4, 6]])
    compare_with_baseline(bad, base)
    assert bad["lossless"] is False and bad["mismatches"][0]["prompt"] == 1
    assert bad["per_prompt"][1]["first_mismatch"] == 1 and bad["speedup_vs_ar"] == 1.0
    sampled = row([[9]], t=1.0)
    compare_with_baseline(sampled, row([[1]], t=1.0))
    assert sampled["lossless"] is None
    assert first_mismatch([1, 2], [1, 2, 3]) == 2 and first_mismatch([1], [1]) is None


def test_policy_list_parsing():
    from bench.suite import parse_policies

    assert parse_policies("ddtree,beam:width=4") == ["ddtree", "beam:width=4"]
    assert parse_policies("static:tree=0;1;0.0, chain") == ["static:tree=0;1;0.0", "chain"]
    assert parse_policies("mine:a=1,b=2,ddtree") == ["mine:a=1,b=2", "ddtree"]


@pytest.mark.parametrize("args,needle", [
    (["--methods", "ar,nope"], "nope"),
    (["--policies", "bogus"], "bogus"),
    (["--budgets", "0"], "--budgets"),
    (["--budgets", "x"], "--budgets"),
    (["--temperatures", "-1"], "--temperatures"),
    (["--repeats", "0"], "--repeats"),
    (["--round-latency", "gpt5"], "gpt5"),
    (["--time-limit", "0"], "--time-limit"),
    (["--compile-workers", "0"], "--compile-workers"),
    (["--torch-baseline", "--torch-device", "cuda"], "--torch-device cpu"),  # this CPU-only torch
    (["--prompts", "/nonexistent/p.jsonl"], "not found"),
    (["--deterministic", "--attn-impl", "xla"], "drop --attn-impl"),
])
def test_bad_options_are_user_errors(tmp_path, args, needle):
    from bench.suite import main

    with pytest.raises(UserError) as e:
        main([*args, "--out", str(tmp_path / "o")])
    assert needle in str(e.value)


def test_deterministic_reaches_every_rows_generator(monkeypatch):
    import ddtree_jax.generator as gen_mod
    from bench.suite import RunConfig, SuiteOptions, make_generator

    seen = []
    monkeypatch.setattr(gen_mod, "Generator", lambda ckpt, **kw: seen.append(kw))
    for det in (False, True):
        make_generator(None, RunConfig("ddtree", "ddtree", 8), SuiteOptions(deterministic=det), executables=None)
    assert [kw["deterministic"] for kw in seen] == [False, True]


def test_empty_prompt_file(tmp_path):
    from bench.suite import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match="no prompts"):
        main(["--prompts", str(empty), "--out", str(tmp_path / "o")])


def test_missing_checkpoint_is_one_line_exit_2(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-m", "bench", "--ckpt", str(tmp_path / "missing"), "--out",
                        str(tmp_path / "o")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("bench: error:") and "not found" in lines[0]


def test_commands_dispatch_to_each_modules_main(tmp_path, capsys):
    """`python -m bench COMMAND ARGS` runs that module's main(ARGS); plain options are the suite's;
    --help lists the commands with their modules' first docstring lines; an unknown command is a
    one-line user error."""
    from bench import __main__ as cli

    assert cli.main(["--help"]) == 0
    listing = capsys.readouterr().out
    for name in ("suite", "round", "profile", "merge", "plots", "draft-vocab", "prompts"):
        assert f"  {name} " in listing, name
    assert "Round latency on a large random-weight model" in listing
    assert set(cli.available()) <= set(cli.COMMANDS) and "suite" in cli.available()
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert cli.main(["plots", str(bad)]) == 2  # bench.plots.main([...])'s own refusal
    with pytest.raises(UserError, match="unknown command 'nope'"):
        cli.main(["nope"])
    with pytest.raises(UserError, match="--out"):  # the suite's validation: its --out is a file
        cli.main(["--out", str(bad)])


def test_the_default_prompts_ship_with_the_repository():
    """The suite's default corpus is inside the repository (a clone runs it anywhere): every eval
    document of the shipped pair's corpus, cut to what the prompts read, one JSON object a line."""
    import lzma

    from bench.prompts import EVAL_CHARS, default_data

    path = default_data()
    assert path == ROOT / "bench" / "data" / "eval_prompts.jsonl.xz" and path.is_file()
    with lzma.open(path, "rt", encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert len(records) >= 64 and path.stat().st_size < 300_000
    assert all(set(r) == {"path", "split", "text"} and r["split"] == "eval" for r in records)
    assert all(0 < len(r["text"]) <= EVAL_CHARS for r in records)
    assert len({r["path"] for r in records}) == len(records)


def test_a_run_stopped_midway_keeps_its_rows(tmp_path, monkeypatch):
    """bench.json is rewritten after every row, so a killed run (a device time limit) keeps them."""
    from bench import suite

    real = suite.run_config
    done = []

    def run_then_stop(gen, *a, **kw):
        if len(done) == 2:
            raise KeyboardInterrupt  # as if the process were stopped here
        done.append(gen.method)
        return real(gen, *a, **kw)

    monkeypatch.setattr(suite, "run_config", run_then_stop)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        suite.main(["--num-prompts", "1", "--prompt-tokens", "16", "--max-new-tokens", "4", "--methods", "ar,dflash,ddtree",
              "--policies", "ddtree", "--budgets", "4", "--temperatures", "0", "--repeats", "1",
              "--profile-prompts", "0", "--no-progress", "--no-plots", "--out", str(out)])
    bench = json.loads((out / "bench.json").read_text())
    assert [r["method"] for r in bench["runs"]] == ["ar", "dflash"]
    assert bench["partial"].startswith("2 of 3 rows")


def test_merge_runs_of_several_calls(tmp_path):
    """Runs split over device calls merge into one bench.json, summary and plots; overlapping
    rows and different settings are refused with one line."""
    from bench import merge
    from bench.prompts import Prompt
    from bench.suite import SuiteOptions, compare_with_baseline, run_config

    prompts = [Prompt(0, "a", (1, 2))]

    def run_dir(name, temps, partial=None):
        rows = []
        for t in temps:
            row = run_config(_FakeGenerator(), prompts, t, SuiteOptions(max_new_tokens=9, repeats=1, profile_prompts=1))
            compare_with_baseline(row, row)
            rows.append(row)
        for r in rows:
            r.pop("_tokens", None)
        d = tmp_path / name
        d.mkdir()
        bench = {"config": {"ckpt": "x", "dtype": "float32", "num_prompts": 1, "temperatures": list(temps)},
                 "environment": {"device_kind": "fake", "commit": name}, "runs": rows, "all_lossless": True}
        if partial:
            bench["partial"] = partial
        (d / "bench.json").write_text(json.dumps(bench))
        return str(d)

    a, b = run_dir("a", [0.0]), run_dir("b", [1.0], partial="1 of 2 rows")
    out = tmp_path / "merged"
    assert merge.main([a, b, "--out", str(out)]) == 0
    m = json.loads((out / "bench.json").read_text())
    assert [r["temperature"] for r in m["runs"]] == [0.0, 1.0] and m["config"]["temperatures"] == [0.0, 1.0]
    assert [x["commit"] for x in m["merged_from"]] == ["a", "b"] and "partial" not in m
    assert (out / "summary.md").read_text().count("| ddtree | ddtree | 8 |") == 2
    for name in PLOTS:
        assert (out / name).read_bytes()[:8] == PNG, name
    with pytest.raises(UserError, match="in both"):
        merge.main([a, a, "--out", str(out)])
    c = run_dir("c", [1.0])
    cfg = json.loads(Path(c, "bench.json").read_text())
    cfg["config"]["dtype"] = "bfloat16"
    Path(c, "bench.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="dtype"):
        merge.main([a, c, "--out", str(out)])


def test_time_limit_skips_the_rows_that_would_not_fit(monkeypatch):
    """run_suite stops before a row that would end after the deadline (judged by the longest row
    so far) and lists what it skipped; the rows it ran are complete."""
    import time

    import ddtree_jax.generator as G
    from bench import suite
    from bench.prompts import Prompt

    class Slow(_FakeGenerator):
        def __init__(self, ckpt, *, method, policy, budget, **kw):
            super().__init__()
            self.method, self.policy_name, self.budget = method, policy, budget

        def generate_ids(self, *a, **kw):
            time.sleep(0.2)
            return super().generate_ids(*a, **kw)

    monkeypatch.setattr(G, "Generator", Slow)
    configs = suite.matrix(["ar", "dflash", "ddtree"], ["ddtree"], [4])
    opts = suite.SuiteOptions(max_new_tokens=9, temperatures=(0.0,), repeats=1, profile_prompts=1)
    # a row is 3 calls (warm-up, one timed, one profiled): ~0.6 s; the second would end after 1.0 s
    res = suite.run_suite(None, [Prompt(0, "a", (1, 2))], configs, opts, progress=False, log=lambda s: None,
                          deadline=time.perf_counter() + 1.0)
    assert [r["method"] for r in res["rows"]] == ["ar"]
    assert res["skipped"] == ["dflash T=0", "ddtree[ddtree] B=4 T=0"] and res["compile_ahead"] is None
    assert res["rows"][0]["row_timing"]["row_s"] >= 0.6


def test_time_limit_too_short_for_any_row_still_writes_a_valid_run(tmp_path):
    from bench.suite import FINISH_RESERVE_S, main

    out = tmp_path / "run"
    rc = main(["--num-prompts", "1", "--prompt-tokens", "16", "--max-new-tokens", "4", "--methods", "ar",
               "--temperatures", "0", "--repeats", "1", "--torch-baseline", "--no-progress",
               "--time-limit", str(FINISH_RESERVE_S + 0.001), "--out", str(out)])
    assert rc == 0
    bench = json.loads((out / "bench.json").read_text())
    assert bench["runs"] == [] and bench["partial"].startswith("0 of 1 rows: --time-limit")
    assert bench["not_run"] == ["ar T=0", "torch baseline"] and "torch_baseline" not in bench
    assert (out / "summary.md").is_file() and not list(out.glob("*.png"))


def _stage_inputs(gen, spec, knobs):
    """Abstract inputs of every stage of one round after the prefill (shapes only, nothing runs)."""
    import functools

    import jax
    import jax.numpy as jnp

    from ddtree_jax import engine
    from ddtree_jax.walk import walk

    tc, dc = gen.tcfg, gen.dcfg
    caches = engine.new_caches(tc, dc, spec, 1, gen.tparams["embed"].dtype)
    pre = (gen.tparams, gen.dparams, *caches, jax.ShapeDtypeStruct((1, 32), jnp.int32),
           jax.ShapeDtypeStruct((1,), jnp.int32), jax.ShapeDtypeStruct((1,), jnp.int32), knobs, jax.random.PRNGKey(0))
    state = jax.eval_shape(functools.partial(engine._prefill, tcfg=tc, dcfg=dc, spec=spec), *pre)
    key = jax.ShapeDtypeStruct((2,), jnp.uint32)
    if spec.speculative:
        logp = jax.eval_shape(functools.partial(engine.draft_stage, tcfg=tc, dcfg=dc, spec=spec),
                              gen.tparams, gen.dparams, state)
        tree = jax.eval_shape(functools.partial(engine.tree_stage, spec=spec), logp, state)
    else:
        logp, tree = None, jax.eval_shape(engine.root_tree, state)
    logits, tapped, new_kv = jax.eval_shape(functools.partial(engine.verify_stage, tcfg=tc, dcfg=dc, spec=spec),
                                            gen.tparams, state, tree)
    tokens = jax.ShapeDtypeStruct(logits.shape[:-1], jnp.int32)
    result = jax.eval_shape(lambda t, x: walk(t, x, dc.depth if spec.speculative else 0), tree, tokens)
    args = {"verify": (gen.tparams, state, tree), "choose": (logits, key, knobs, tokens), "walk": (tree, tokens),
            "commit": (gen.dparams, state, new_kv, tapped, result, knobs)}
    if spec.speculative:
        args.update(draft=(gen.tparams, gen.dparams, state), tree=(logp, state))
    return pre, args


@pytest.mark.parametrize("method,policy,budget,temperature,top_k,attn_impl", [
    ("ar", "chain", 0, 0.0, 0, "auto"), ("dflash", "chain", 0, 1.0, 0, "auto"), ("ddtree", "ddtree", 16, 0.0, 0, "xla"),
    ("ddtree", "beam:width=4", 64, 0.7, 5, "pallas_interpret"),
])
def test_shared_stage_and_prefill_programs_equal_the_specs_own(method, policy, budget, temperature, top_k,
                                                                attn_impl):
    """Executables shared between specs (the prefill per `engine.prefill_spec`, each profiled stage
    per `profile._stage_key`) are the very programs each spec would compile for itself: the jaxprs
    are equal, so a stage reading a spec field its key leaves out fails here."""
    import dataclasses
    import functools

    import jax

    from ddtree_jax import engine, profile
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.checkpoint import DEFAULT_CKPT
    from ddtree_jax.generator import Generator
    from ddtree_jax.sampling import SamplingConfig

    gen = Generator(load_checkpoint(DEFAULT_CKPT, dtype="float32"), method=method, policy=policy, budget=budget or 1,
                    attn_impl=attn_impl)
    spec = dataclasses.replace(gen.spec_for(32, 24, SamplingConfig.make(temperature, top_k)), unroll=2)
    knobs = engine.make_knobs(temperature, 0.9, [0])
    pre, args = _stage_inputs(gen, spec, knobs)

    def jaxpr(fn, *a):
        return str(jax.make_jaxpr(fn)(*a))

    static = dict(tcfg=gen.tcfg, dcfg=gen.dcfg)
    assert (jaxpr(functools.partial(engine._prefill, spec=spec, **static), *pre)
            == jaxpr(functools.partial(engine._prefill, spec=engine.prefill_spec(spec), **static), *pre))
    for name, a in args.items():
        tcfg, dcfg, shared, extra = profile._stage_key(name, gen.tcfg, gen.dcfg, spec)
        own = profile._stage_fn(name, gen.tcfg, gen.dcfg, spec, extra)
        assert jaxpr(own, *a) == jaxpr(profile.stage_functions(gen.tcfg, gen.dcfg, spec)[name], *a), name
        assert profile.stage_functions(gen.tcfg, gen.dcfg, spec)[name] is profile._stage_fn(name, tcfg, dcfg, shared,
                                                                                         extra)


def test_generators_share_executables():
    """Generators given one `Executables` compile a prefill once for configs that differ in the
    tree alone; their greedy outputs stay equal (lossless)."""
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.checkpoint import DEFAULT_CKPT
    from ddtree_jax.generator import Executables, Generator

    ckpt = load_checkpoint(DEFAULT_CKPT, dtype="float32")
    shared = Executables()
    prompt = [[5, 9, 200, 31, 7, 64, 12, 3] * 3]
    a = Generator(ckpt, method="dflash", executables=shared).generate_ids(prompt, max_new_tokens=8)[0]
    assert sorted(k[0] for k in shared) == ["prefill", "rounds"]
    b = Generator(ckpt, method="ddtree", budget=16, executables=shared).generate_ids(prompt, max_new_tokens=8)[0]
    assert sorted(k[0] for k in shared) == ["prefill", "rounds", "rounds"]  # same cache size: one prefill
    assert a.token_ids == b.token_ids and len(a.token_ids) == 8


def test_commit_given_or_read_from_git(tmp_path):
    """--commit is recorded as given (a device copy has no usable .git); otherwise git says."""
    from bench.suite import git_commit

    assert git_commit(tmp_path, "abc1234") == {"commit": "abc1234", "dirty": None}
    assert git_commit(tmp_path)["commit"] is None  # not a git checkout


def test_round_latency_part_times_the_stages_in_device_loops(monkeypatch):
    """The suite's --round-latency rows take bench_round's device-loop stages (synced stage calls
    are host-bound on the large shapes) and report the overhead beyond the verify."""
    from bench import bench_round, suite

    calls = []

    def measure(gen, prompt_len, rounds, repeats, stage_repeats=5, batch=1, verify_loop=False, stage_loop=False):
        calls.append((gen.method, stage_repeats, stage_loop))
        return dict(round_ms_median=2.0, round_ms_steady=2.0, verify_ms_steady=1.5, stage_ms=dict(verify=1.5))

    monkeypatch.setattr(bench_round, "measure", measure)
    lines = []
    out = suite.round_latency("tiny", [4], ["ddtree"], repeats=1, prompt_len=16, rounds=2, log=lines.append)
    assert calls == [("ar", 0, True), ("dflash", 0, True), ("ddtree", 0, True)]
    assert [(r["method"], r["budget"]) for r in out["rows"]] == [("ar", 0), ("dflash", 7), ("ddtree", 4)]
    assert all(line.endswith("beyond the verify 25 %") for line in lines)
