"""The generate CLI end to end (subprocess), and its error contract: exit 2, one line, no traceback."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gen(*args, env=None, timeout=300):
    e = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ddtree_jax.generate", *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


def test_json_output_all_methods_identical(qwen3_pair, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n" + json.dumps({"text": "hello world"}) + "\n")
    outs = {}
    for method in ("ar", "dflash", "ddtree"):
        r = gen("--ckpt", qwen3_pair.out, "--method", method, "--budget", 16, "--prompt-file", prompts,
                "--max-new-tokens", 12, "--json")
        assert r.returncode == 0, r.stderr
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(rows) == 2
        # compilation is announced on stderr (stdout stays pure JSON); both prompts share one bucket
        assert r.stderr.count("[ddtree] compiling the rounds") == 1 and "rounds compiled in" in r.stderr
        for row in rows:
            for key in ("token_ids", "text", "num_output_tokens", "time_s", "tokens_per_s", "rounds",
                        "acceptance_lengths", "mean_acceptance"):
                assert key in row
            assert row["num_output_tokens"] == len(row["token_ids"]) <= 12
        outs[method] = [row["token_ids"] for row in rows]
    assert outs["ar"] == outs["dflash"] == outs["ddtree"]


def test_streaming_text_and_profile(qwen3_pair):
    r = gen("--ckpt", qwen3_pair.out, "--prompt", "import os", "--max-new-tokens", 10, "--profile")
    assert r.returncode == 0, r.stderr
    assert "tok/s" in r.stderr and "stage ms/round" in r.stderr and "verify" in r.stderr


def _fails(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("args,needles", [
    (("--budget", -1), ("--budget", ">= 0")),
    (("--temperature", -0.5), ("--temperature",)),
    (("--top-p", 0), ("--top-p", "(0, 1]")),
    (("--top-p", 1.5), ("--top-p",)),
    (("--tree-policy", "nope"), ("nope", "ddtree")),
    (("--tree-policy", "static:tree=0;1.0.0"), ("static",)),
    (("--prompt", ""), ("empty",)),
    (("--max-new-tokens", 600), ("context",)),
    (("--budget", 100000), ("--budget",)),
])
def test_bad_options(qwen3_pair, args, needles):
    base = ["--ckpt", qwen3_pair.out, "--max-new-tokens", 4]
    if "--prompt" not in args:
        base += ["--prompt", "x"]
    _fails(gen(*base, *args), *needles)


def test_missing_checkpoint(tmp_path):
    _fails(gen("--ckpt", tmp_path / "nope", "--prompt", "x"), "not found")


def test_hf_directory_is_not_a_converted_checkpoint(qwen3_pair):
    _fails(gen("--ckpt", qwen3_pair.hf_target, "--prompt", "x"), "convert")


def test_bad_tuned_tables_fail_before_loading(tmp_path):
    """A malformed, or missing, file named by $DDTREE_ATTENTION_TABLE / $DDTREE_MATMUL_TABLE, or a
    malformed $DDTREE_MGPU_ATTENTION / $DDTREE_MGPU_CONFIG / $DDTREE_F32_ATTENTION_DOT, is a
    one-line error before any checkpoint is read (this checkpoint path does not even exist)."""
    bad = tmp_path / "bad.json"
    bad.write_text('{"NVIDIA H200": [{"t": [1, 2], "config": {}}]}')
    ck = ("--ckpt", tmp_path / "nope", "--prompt", "x")
    _fails(gen(*ck, env={"DDTREE_ATTENTION_TABLE": str(bad)}), "attention table", "needs t")
    _fails(gen(*ck, env={"DDTREE_MATMUL_TABLE": str(tmp_path / "typo.json")}), "DDTREE_MATMUL_TABLE", "does not exist")
    bad.write_text('{"NVIDIA H200": [{"k": 1, "n": 2, "rows": [1, 16], "config": [1, 2, 3, 4, 5, 6, 7, 8]}]}')
    _fails(gen(*ck, env={"DDTREE_MATMUL_TABLE": str(bad)}), "matmul table", "MatmulConfig")
    _fails(gen(*ck, env={"DDTREE_MGPU_ATTENTION": "257"}), "DDTREE_MGPU_ATTENTION", "LO-HI")
    _fails(gen(*ck, env={"DDTREE_MGPU_CONFIG": "64x3"}), "DDTREE_MGPU_CONFIG", "BKxSTAGESwWGS")
    _fails(gen(*ck, env={"DDTREE_F32_ATTENTION_DOT": "tf32"}), "DDTREE_F32_ATTENTION_DOT", "tf32x3")


def test_prompt_files(qwen3_pair, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    _fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", empty), "no prompts")
    _fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", tmp_path / "missing.txt"), "not found")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": \n')
    _fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", bad), "JSON")


def test_speculation_needs_a_drafter(llama_target):
    _fails(gen("--ckpt", llama_target.out, "--prompt", "x", "--method", "ddtree"), "drafter", "--method ar")


def test_not_enough_memory_is_refused_before_allocating(qwen3_pair):
    r = gen("--ckpt", qwen3_pair.out, "--prompt", "x", env={"DDTREE_MEMORY_LIMIT_BYTES": "1000"})
    _fails(r, "not enough device memory", "GiB")


def test_debug_shows_traceback(qwen3_pair):
    r = gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--budget", -1, "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr
