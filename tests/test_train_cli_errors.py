"""The training CLI's error contract (`python -m ddtree_jax.train`): in process, and through a real
subprocess for a few cases and the interrupt.

Every bad input: exit code 2, exactly one non-empty line on stderr that names the problem (and
the fix), no traceback, and nothing written. An interrupt (SIGINT) during a tiny CPU target run
keeps the last good checkpoint, leaves no temporary directories and says where the checkpoint is.

Most error cases run in process (a subprocess is mostly interpreter and jax import time); the
subprocess ones run while they do.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from corpus import SNIPPETS, write_corpus

ROOT = Path(__file__).resolve().parent.parent
PROG = "ddtree_jax.train: error: "

TINY = ["--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
        "--intermediate", "64", "--max-position", "64"]
CPU = ["--seq-len", "32", "--batch-size", "4", "--compute-dtype", "float32", "--export-dtype", "float32"]
QWEN3_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 300, "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True, "hidden_act": "silu"}


def _env() -> dict[str, str]:
    return dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))


def _popen(args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ddtree_jax.train", *map(str, args)], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """Inputs, good and bad: a corpus, a tiny tokenizer, HF target directories that are not usable."""
    from ddtree_jax.train.tokenizer import save_tokenizer, train_tokenizer

    d = tmp_path_factory.mktemp("train_cli")
    f = {"dir": d, "data": write_corpus(d / "corpus.jsonl", snippets=SNIPPETS[:4])}
    f["tok"] = d / "tok"
    save_tokenizer(train_tokenizer(SNIPPETS * 10, 300), f["tok"])
    (d / "empty.jsonl").write_text("\n")
    f["empty"] = d / "empty.jsonl"
    f["no_text"] = d / "no_text.jsonl"
    f["no_text"].write_text(json.dumps({"path": "a.py", "content": "x = 1\n"}) + "\n")
    f["llama"] = d / "llama"
    f["llama"].mkdir()
    (f["llama"] / "config.json").write_text(json.dumps({**QWEN3_CONFIG, "architectures": ["LlamaForCausalLM"],
                                                          "model_type": "llama"}))
    f["no_config"] = d / "no_config"
    f["no_config"].mkdir()
    (f["no_config"] / "model.safetensors").write_bytes(b"\0" * 16)
    f["corrupt"] = d / "corrupt"
    f["corrupt"].mkdir()
    (f["corrupt"] / "config.json").write_text(json.dumps(QWEN3_CONFIG))
    (f["corrupt"] / "model.safetensors").write_bytes(b"\xff" * 64)
    # a good tiny Qwen3 target (random weights), for the cases that get past loading it
    import jax

    from ddtree_jax.models.config import TargetConfig
    from ddtree_jax.models.init import init_target
    from ddtree_jax.train.export import export_target

    cfg = TargetConfig.from_hf(QWEN3_CONFIG)
    f["good"] = export_target(d / "good", cfg, jax.device_get(init_target(cfg, jax.random.PRNGKey(0))),
                              tokenizer_dir=f["tok"], eos_id=0, dtype="float32")
    # an OUT that already holds a run (a checkpoint directory)
    f["taken"] = d / "taken"
    (f["taken"] / "ckpt").mkdir(parents=True)
    (f["taken"] / "ckpt" / "keep.txt").write_text("keep")
    return f


def _cases(f: dict[str, Path]) -> dict[str, tuple[list, tuple[str, ...], Path | None]]:
    """name -> (argv, needles expected in the one stderr line, an OUT that must not be created)."""
    out = f["dir"] / "out"
    tgt = ["target", "--tokenizer", f["tok"], *TINY, *CPU]
    drf = ["drafter", "--data", f["data"], "--tokenizer", f["tok"], *CPU]
    return {
        "missing_data": ([*tgt, "--data", f["dir"] / "nope.jsonl", "--out", out / "a"],
                         ("nope.jsonl", "not found", "'text' field"), out / "a"),
        "empty_data": ([*tgt, "--data", f["empty"], "--out", out / "b"],
                       ("empty.jsonl", "no non-empty documents"), out / "b"),
        "no_text_field": ([*tgt, "--data", f["no_text"], "--out", out / "c"],
                          ("no_text.jsonl:1", "'text'"), out / "c"),
        "missing_tokenizer": (["target", "--data", f["data"], "--tokenizer", f["dir"] / "no_tok", "--out", out / "d"],
                              ("no_tok", "not found", "python -m ddtree_jax.train tokenizer"), out / "d"),
        "llama_target": ([*drf, "--target", f["llama"], "--out", out / "e"],
                         ("not a Qwen3 checkpoint", "LlamaForCausalLM"), out / "e"),
        "target_without_config": ([*drf, "--target", f["no_config"], "--out", out / "f"],
                                  ("no config.json",), out / "f"),
        "missing_target": ([*drf, "--target", f["dir"] / "no_target", "--out", out / "g"],
                           ("no_target", "not found"), out / "g"),
        "corrupt_target": ([*drf, "--target", f["corrupt"], "--out", out / "h"],
                           ("not a valid safetensors file", "model.safetensors"), out / "h"),
        "block_size_1": ([*drf, "--target", f["good"], "--block-size", 1, "--out", out / "i"],
                         ("--block-size", "at least 2"), out / "i"),
        "output_exists": ([*tgt, "--data", f["data"], "--out", f["taken"]],
                          ("already holds a training run", "--resume", "--force"), None),
        "resume_without_checkpoint": ([*tgt, "--data", f["data"], "--out", out / "j", "--resume"],
                                      ("--resume", "no checkpoint"), out / "j"),
        "bad_option_value": ([*tgt, "--data", f["data"], "--out", out / "k", "--steps", "many"],
                             ("--steps", "many"), out / "k"),
        "missing_option": (["target", "--data", f["data"], "--out", out / "l"],
                           ("--tokenizer",), out / "l"),
        "lr_nan": ([*tgt, "--data", f["data"], "--out", out / "m", "--lr", "nan"],
                   ("--lr must be a finite number > 0, got nan",), out / "m"),
    }


# Through a real process (the exit code, stderr as a user sees it); the rest run in process.
SUBPROCESS_CASES = ("missing_data", "lr_nan")


def _in_process(argv) -> tuple[int, str, str]:
    import contextlib
    import io

    from ddtree_jax.errors import cli_main
    from ddtree_jax.train.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(main, [str(a) for a in argv], prog="ddtree_jax.train")
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def results(files):
    """Run every error case; name -> (returncode, stdout, stderr)."""
    cases = _cases(files)
    procs = {name: _popen(cases[name][0]) for name in SUBPROCESS_CASES}
    got = {name: _in_process(argv) for name, (argv, _, _) in cases.items() if name not in procs}
    for name, p in procs.items():
        so, se = p.communicate(timeout=180)
        got[name] = (p.returncode, so, se)
    return got


CASE_NAMES = ["missing_data", "empty_data", "no_text_field", "missing_tokenizer", "llama_target",
              "target_without_config", "missing_target", "corrupt_target", "block_size_1", "output_exists",
              "resume_without_checkpoint", "bad_option_value", "missing_option", "lr_nan"]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_bad_input_is_one_line(files, results, name):
    assert sorted(CASE_NAMES) == sorted(_cases(files))
    _, needles, out = _cases(files)[name]
    rc, _, err = results[name]
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert lines[0].startswith(PROG), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    if out is not None:
        assert not out.exists(), f"{out} was created by a failing run"
    assert sorted(p.name for p in (files["taken"]).iterdir()) == ["ckpt"]
    assert [p.name for p in (files["taken"] / "ckpt").iterdir()] == ["keep.txt"]


def test_debug_shows_a_traceback(files):
    p = _popen(["target", "--data", files["dir"] / "nope.jsonl", "--tokenizer", files["tok"],
                "--out", files["dir"] / "dbg", "--debug"])
    _, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "Traceback" in err and "UserError" in err


def test_sigint_keeps_the_last_good_checkpoint(files, tmp_path):
    """Ctrl-C in the middle of training: exit 130, the checkpoint of the message is the one on
    disk and it restores, no temporary directories are left, and --resume would continue."""
    from ddtree_jax.checkpoint import load_params

    out = tmp_path / "run"
    p = _popen(["target", "--data", files["data"], "--tokenizer", files["tok"], "--out", out, *TINY, *CPU,
                "--steps", 100000, "--ckpt-every", 3, "--eval-every", 0, "--log-every", 3, "--warmup", 1,
                "--no-keep-best"])
    meta = out / "ckpt" / "meta.json"
    deadline = time.monotonic() + 90
    try:
        while not meta.exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert meta.exists(), f"no checkpoint appeared: {p.poll()} {p.stderr.read() if p.poll() is not None else ''}"
        first = json.loads(meta.read_text())["step"]
        while json.loads(meta.read_text())["step"] == first and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # a second checkpoint: the interrupt now lands mid-run, often mid-save
        time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        try:
            so, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            so, err = p.communicate()
            pytest.fail(f"the run did not stop within 60 s of SIGINT; its stderr:\n{err[-4000:]}")
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, (p.returncode, err)
    assert "Traceback" not in err
    step = json.loads(meta.read_text())["step"]
    assert step > first
    lines = [line for line in err.splitlines() if line.strip()]
    assert any(f"the last good checkpoint (step {step}) is in {out / 'ckpt'}" in line and "--resume" in line
               for line in lines), err
    assert lines[-1].startswith("ddtree_jax.train: interrupted"), err
    leftovers = [str(q.relative_to(out)) for q in out.rglob("*") if ".tmp-" in q.name or ".old-" in q.name]
    assert leftovers == []
    assert sorted(q.name for q in out.iterdir()) in (["ckpt"], ["ckpt", "metrics.json"])
    state = load_params(out / "ckpt" / "state")
    assert set(state) == {"params", "opt"} and np.isfinite(state["params"]["embed"]).all()
