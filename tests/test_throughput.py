"""`python -m bench throughput` end to end on the shipped pair (tiny), its projection against a
cost model of known coverage, the CLI check's bookkeeping, and the error contract (exit 2, one line)."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from ddtree_jax.errors import UserError, cli_main

PNG = b"\x89PNG\r\n\x1a\n"
SHAPE = {"layers": 4, "hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2, "head_dim": 64, "vocab": 8192,
         "dtype": "bfloat16", "drafter_layers": 2, "block_size": 16}


def cost_file(path: Path, points: list[tuple[str, int, int, float]]) -> Path:
    """A cost model of (method, batch, nodes, ms) points at prefix 512."""
    path.write_text(json.dumps({
        "format": "ddtree-cost-model", "version": 1, "device_kind": "test device", "model": SHAPE, "metric": "call",
        "source": "tests", "points": [{"method": m, "batch": b, "nodes": n, "prefix": 512, "round_ms": ms}
                                      for m, b, n, ms in points]}))
    return path


def test_throughput_end_to_end_on_the_shipped_pair(tmp_path):
    from bench.throughput import main

    # AR covered at batches 1 and 2, DDTree-16 at batch 1 only: its batch-2 cell must stay blank
    cost = cost_file(tmp_path / "cost.json", [("ar", 1, 0, 5.0), ("ar", 2, 0, 8.0), ("ddtree", 1, 16, 10.0)])
    out = tmp_path / "run"
    rc = main(["--num-prompts", "2", "--prompt-tokens", "32", "--batches", "2,1", "--methods", "ar,ddtree",
               "--budgets", "16", "--max-new-tokens", "8", "--repeats", "1", "--ignore-eos", "--no-progress",
               "--cost-model", str(cost), "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "throughput.json").read_text())
    assert doc["config"]["batches"] == [1, 2] and doc["config"]["num_prompts"] == 2
    rows = {(r["label"], r["batch"]): r for r in doc["measured"]}
    assert list(rows) == [("AR", 1), ("AR", 2), ("DDTree-16", 1), ("DDTree-16", 2)]
    for (name, batch), r in rows.items():
        assert r["output_tokens"] == 16 and r["tokens_per_s"] > 0 and r["reference_batch"] == 1
        assert r["tokens_equal"] is True and r["mismatches"] == [] and r["lossless_vs_ar"] is True, (name, batch)
        # a batch of 2 runs until its longer row is done: fewer device rounds than its rows' sum
        assert (r["device_rounds"] == r["rounds"]) if batch == 1 else (r["device_rounds"] < r["rounds"])
    assert rows[("AR", 1)]["mean_acceptance"] == 1.0 and rows[("AR", 1)]["rounds"] == 2 * 7
    acc = rows[("DDTree-16", 1)]["mean_acceptance"]
    assert acc == rows[("DDTree-16", 2)]["mean_acceptance"] and acc >= 1.0

    proj = doc["projection"]
    assert proj["device"] == "test device" and proj["acceptance"] == {"16": acc} and "projection" in proj["note"]
    assert proj["series"]["AR"]["tokens_per_s"] == pytest.approx([1000 * 1 / 5.0, 1000 * 2 / 8.0])
    ddtree = proj["series"]["DDTree-16"]["tokens_per_s"]
    assert ddtree[0] == pytest.approx(1000 * acc / 10.0) and ddtree[1] is None
    summary = (out / "summary.md").read_text()
    assert "## Measured" in summary and "## Projected (a projection, not a measurement)" in summary
    assert summary.count("Command: `python -m bench throughput") == 2 and "| DDTree-16 | " in summary
    assert f"| DDTree-16 | {ddtree[0]:.0f} | - |" in summary  # the blank cell
    for name in ("throughput_measured.png", "throughput_projected.png"):
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 5000, name


def test_the_shipped_cost_model_is_the_default_of_its_shape():
    from types import SimpleNamespace

    from bench.throughput import pick_cost_model, signature_for

    args = SimpleNamespace(cost_model=None, project_shape="qwen3-8b", project_device=None)
    picked = pick_cost_model(args)   # H100 and H200 ship one: on the CPU, the one covering more batches
    assert picked.model == signature_for("qwen3-8b") and picked.device_kind == "NVIDIA H100 80GB HBM3"
    args.project_device = "NVIDIA H200"
    assert pick_cost_model(args).device_kind == "NVIDIA H200"
    with pytest.raises(UserError, match="no single shipped cost model .* on Some GPU"):
        pick_cost_model(SimpleNamespace(cost_model=None, project_shape="qwen3-8b", project_device="Some GPU"))
    with pytest.raises(UserError, match="not one of bench round's shapes"):
        pick_cost_model(SimpleNamespace(cost_model=None, project_shape="nope", project_device=None))


def test_cli_check_row_bookkeeping():
    from bench.throughput import cli_row

    calls = []

    def runner(out: str, rc: int = 0, err: str = ""):
        def run(argv):
            calls.append(argv)
            return 2.0, subprocess.CompletedProcess(argv, rc, out, err)
        return run

    lines = [json.dumps({"token_ids": ids, "num_output_tokens": len(ids), "time_s": t})
             for ids, t in (([1, 2, 3], 0.5), ([4, 5], 0.5), ([6], 0.25))]
    err = "[ddtree] prefill compiled in 0.5s\n[ddtree] rounds compiled in 1.25s\n"
    row, tokens = cli_row(["python", "-m", "x"], 2, runner("\n".join(lines) + "\n", err=err))
    assert len(calls) == 2  # a warm-up run, then the timed one
    assert tokens == [[1, 2, 3], [4, 5], [6]]
    assert row["output_tokens"] == 6 and row["wall_s"] == 2.0 and row["tokens_per_s_wall"] == 3.0
    assert row["generate_s"] == 0.75 and row["tokens_per_s_generate"] == 8.0  # one clock per batch of 2
    assert row["compile_s"] == 1.75
    row, tokens = cli_row(["python"], 1, runner("", 2, "Traceback\nbench: error: no checkpoint\n"))
    assert tokens is None and row["error"] == "bench: error: no checkpoint" and row["returncode"] == 2


def test_token_comparison_reports_each_mismatch():
    from bench.throughput import compare_tokens

    assert compare_tokens([[1, 2, 3], [4]], [[1, 2, 3], [4]]) == []
    bad = compare_tokens([[1, 2, 3], [4, 5]], [[1, 9, 3], [4, 5]])
    assert bad == [{"prompt": 0, "first_mismatch": 1, "ours": [1, 2, 3], "reference": [1, 9, 3]}]


def test_auto_is_passed_to_the_generator_and_its_refusal_is_one_line(monkeypatch):
    import ddtree_jax.generator as generator
    from bench.throughput import make_generator, parse_budgets

    assert parse_budgets("16,auto,16") == [16, "auto"]
    seen = []

    def refuse(ckpt, *, method, policy, budget, executables):
        seen.append(budget)
        return budget < 0  # what a Generator without auto does: compare it as a number

    monkeypatch.setattr(generator, "Generator", refuse)
    with pytest.raises(UserError, match="--budgets auto: this Generator does not take budget 'auto'"):
        make_generator(None, "ddtree", "auto")
    assert seen == ["auto"]


@pytest.mark.parametrize("argv, message", [
    (["--ckpt", "/nonexistent/ckpt"], "checkpoint /nonexistent/ckpt not found"),
    (["--batches", "0,2"], "--batches: invalid batch_list value: '0,2'"),
    (["--batches", "1,x"], "--batches: invalid batch_list value"),
    (["--methods", "ar,beam"], "--methods: unknown method 'beam'"),
    (["--budgets", "16,big"], "--budgets: 'big' is not a DDTree budget"),
    (["--cli-check", "ddtree:0"], "--cli-check ddtree:0: give ddtree:BUDGET"),
    (["--cost-model", "COST"], "COST"),
    (["--record", "nowhere.npz"], "record nowhere.npz not found"),
    (["--no-measure"], "--no-measure projects from a record only"),
    (["--out", "FULL"], "is not empty; give another directory or --force"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    from bench.throughput import main

    bad_cost = tmp_path / "cost.json"
    bad_cost.write_text("{not json")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("x")
    swap = {"COST": str(bad_cost), "FULL": str(full)}
    argv = [swap.get(a, a) for a in argv]
    out = [] if "--out" in argv else ["--out", str(tmp_path / "out")]
    rc = cli_main(main, argv + out, prog="bench throughput")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("bench throughput: error: ") and swap.get(message, message) in err, err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_auto_is_projected_from_a_record_where_the_model_covers_the_batch(tmp_path):
    """--no-measure --record: DFlash, DDTree-16 and auto from the replay alone. auto at batch b is
    the lockstep replay in batches of b with the engine's chooser at the model's batch-b costs: b x
    its tokens a round / its picks' mean ms; blank at batch 4, where the model covers neither
    DFlash nor a DDTree budget."""
    import numpy as np

    from bench.throughput import main
    from ddtree_jax.research import auto_budget, load_record, replay
    from ddtree_jax.research.store import FORMAT, save_record
    from ddtree_jax.cost import load_cost_model

    rng = np.random.default_rng(0)
    p, n, d, k = 4, 24, 15, 16
    outputs = rng.integers(0, 40, (p, n + d)).astype(np.int32)
    logp = -np.sort(rng.random((p, n - 1, d, k)).astype(np.float32), axis=-1) * 3
    ids = np.stack([rng.permutation(40)[:k] for _ in range(p * (n - 1) * d)]).reshape(p, n - 1, d, k)
    ids[:, :, :, 0] = np.stack([outputs[:, 1 + j:1 + j + d] for j in range(n - 1)], axis=1)  # top-1 often right
    ids[:, :, :, 1:] = np.where(ids[:, :, :, 1:] == ids[:, :, :, :1], 40 + np.arange(k - 1), ids[:, :, :, 1:])
    ids[:, ::3, 4:, 0] = 41 + k  # ... but not always: the chain stops early every third root
    header = {"format": FORMAT, "checkpoint": {"path": "x", "fingerprint": "f" * 24}, "block_size": d + 1, "depth": d,
              "vocab_size": 100, "top_k": k, "max_new_tokens": n, "stop_ids": []}
    rec_path = save_record(tmp_path / "rec.npz", header, [np.arange(8)] * p, outputs, logp, ids.astype(np.uint16))
    cost = cost_file(tmp_path / "cost.json", [(m, b, nodes, ms) for b, scale in ((1, 1.0), (2, 1.2))
                                              for m, nodes, ms in (("ar", 0, 5.0), ("dflash", 15, 6.0),
                                                                   ("ddtree", 16, 6.6))
                                              for ms in [ms * scale]] + [("ar", 4, 0, 7.0)])
    out = tmp_path / "proj"
    assert main(["--record", str(rec_path), "--no-measure", "--cost-model", str(cost), "--methods", "ar,dflash,ddtree",
                 "--budgets", "16,auto", "--batches", "1,2,4", "--no-progress", "--out", str(out)]) == 0
    doc = json.loads((out / "throughput.json").read_text())
    proj = doc["projection"]
    assert doc["measured"] == [] and "nothing decoded" in (out / "summary.md").read_text()
    assert list(proj["series"]) == ["AR", "DFlash", "DDTree-16", "auto"]
    rates = proj["series"]["auto"]["tokens_per_s"]
    assert rates[0] is not None and rates[1] is not None and rates[2] is None
    model, rec = load_cost_model(cost), load_record(rec_path)
    for i, b in enumerate((1, 2)):
        res = replay(rec, "ddtree", auto_budget(model, prefix=512), batch=b)
        ms = sum(share * model.round_ms(c, b, 512) for c, share in res.choices.items())
        assert rates[i] == pytest.approx(1000 * b * res.mean_acceptance / ms)
        assert proj["auto_over_best"][i] == pytest.approx(rates[i] / max(
            s["tokens_per_s"][i] for name, s in proj["series"].items() if name != "auto"))
    assert "| auto | " in (out / "summary.md").read_text()
