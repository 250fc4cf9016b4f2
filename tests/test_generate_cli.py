"""The generate CLI end to end (subprocess), and its error contract: exit 2, one line, no traceback."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gen(*args, env=None, timeout=300, input=None):
    e = dict(os.environ, JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-m", "ddtree_jax.generate", *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout, input=input)


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
    assert "tokens/s" in r.stderr and "stage ms/round" in r.stderr and "verify" in r.stderr
    assert "--profile runs each stage" in r.stderr and re.search(r"prompt: \d+ tokens", r.stderr)


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
    (("--budget", 100000), ("--budget", "context")),
    (("--batch-size", 0), ("--batch-size",)),
    (("--stop", ""), ("--stop",)),
    (("--prompt", "-"), ("empty",)),  # nothing piped in
    (("--deterministic", "--matmul-impl", "xla"), ("--deterministic", "--matmul-impl")),
    (("--deterministic", "--tp", "2"), ("--deterministic", "--tp 1")),
])
def test_bad_options(qwen3_pair, args, needles, run):
    base = ["--ckpt", qwen3_pair.out, "--max-new-tokens", 4]
    if "--prompt" not in args:
        base += ["--prompt", "x"]
    _fails(run(*base, *args), *needles)


def test_missing_checkpoint(tmp_path):
    _fails(gen("--ckpt", tmp_path / "nope", "--prompt", "x"), "not found")


def test_speculation_from_an_hf_target_directory_alone_needs_its_drafter(qwen3_pair):
    """--ckpt HF_DIR reads a target directory (no drafter in it): DDTree asks for --draft or a conversion."""
    _fails(gen("--ckpt", qwen3_pair.hf_target, "--prompt", "x"), "convert")


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


@pytest.fixture
def run(capsys, monkeypatch):
    """The CLI in this process (its compiled programs shared between calls): run(*args, stdin=TEXT)."""
    import io
    import types

    from ddtree_jax import cli
    from ddtree_jax.errors import cli_main

    def call(*args, stdin=None):
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin or ""))
        capsys.readouterr()
        try:
            rc = cli_main(cli.main, [str(a) for a in args], prog="ddtree_jax.generate")
        except SystemExit as e:  # --version, --help
            rc = e.code
        cap = capsys.readouterr()
        return types.SimpleNamespace(returncode=rc, stdout=cap.out, stderr=cap.err)

    return call


def _json_rows(r):
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_batched_prompt_file_gives_each_prompt_its_own_tokens(qwen3_pair, tmp_path, run):
    """Prompts of a file decoded together (--batch-size) get the tokens they get one at a time."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\nimport os\nclass A:\nfor i in range(3):\nhello world\n")
    base = ("--ckpt", qwen3_pair.out, "--prompt-file", prompts, "--max-new-tokens", 10, "--json", "--budget", 8)
    one = _json_rows(run(*base, "--batch-size", 1))
    together = _json_rows(run(*base, "--batch-size", 3))
    assert [r["token_ids"] for r in one] == [r["token_ids"] for r in together]
    assert [r["prompt"] for r in together] == ["def f(x):", "import os", "class A:", "for i in range(3):", "hello world"]


def test_text_output_of_several_prompts_is_separated(qwen3_pair, tmp_path, run):
    r = run("--ckpt", qwen3_pair.out, "--prompt-file", "-", "--max-new-tokens", 4, stdin="a b\nc d\n")
    assert r.returncode == 0, r.stderr
    assert "==> prompt 1 of 2 <==" in r.stdout and "==> prompt 2 of 2 <==" in r.stdout


def test_stdin_prompt_equals_the_flag(qwen3_pair, run):
    flag = _json_rows(run("--ckpt", qwen3_pair.out, "--prompt", "def f(x):", "--max-new-tokens", 6, "--json"))
    piped = _json_rows(run("--ckpt", qwen3_pair.out, "--prompt", "-", "--max-new-tokens", 6, "--json",
                           stdin="def f(x):\n"))
    assert piped[0]["token_ids"] == flag[0]["token_ids"] and piped[0]["prompt"] == "def f(x):"


def test_stop_strings_cut_text_and_tokens(qwen3_pair, run):
    """--stop ends a prompt's output before the stop text, in streamed text and in JSON, whose
    token ids end with the token that completes it."""
    base = ("--ckpt", qwen3_pair.out, "--prompt", "def f(x):", "--max-new-tokens", 24, "--ignore-eos")
    full = _json_rows(run(*base, "--json"))[0]
    text = full["text"]
    assert len(text) > 6, text
    stop = text[3:5]
    cut = _json_rows(run(*base, "--json", "--stop", stop))[0]
    assert cut["text"] == text[: text.find(stop)]
    assert full["token_ids"][: len(cut["token_ids"])] == cut["token_ids"]
    assert cut["num_output_tokens"] == len(cut["token_ids"]) < len(full["token_ids"])
    streamed = run(*base, "--stop", stop)
    assert streamed.returncode == 0, streamed.stderr
    assert streamed.stdout == text[: text.find(stop)] + "\n"


def test_ignore_eos_generates_every_token(qwen3_pair, run):
    rows = _json_rows(run("--ckpt", qwen3_pair.out, "--prompt", "x y", "--max-new-tokens", 20, "--json",
                          "--ignore-eos", "--method", "ar"))
    assert rows[0]["num_output_tokens"] == 20


def test_version_help_defaults_and_warnings(qwen3_pair, run):
    v = run("--version")
    assert v.returncode == 0 and v.stdout.startswith("ddtree-jax ")
    h = run("--help")
    assert h.returncode == 0 and "(default: 64)" in h.stdout and "(default: ddtree)" in h.stdout
    r = run("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 3, "--method", "ar", "--budget", 32,
            "--top-p", 0.5)
    assert r.returncode == 0, r.stderr
    assert "--budget has no effect with --method ar" in r.stderr
    assert "--top-p has no effect at --temperature 0" in r.stderr
    assert "--seed has no effect" not in r.stderr


def test_any_seed_is_accepted_and_seeds_do_not_collide():
    from ddtree_jax.generator import prng_key

    seeds = list(range(-1000, 1000)) + [2**32 + k for k in range(-5, 5)] + [2**63, 2**64 - 1, 2**64, -2**64, 10**40]
    keys = {tuple(prng_key(s).tolist()) for s in seeds}
    assert len(keys) == len(seeds)
    import jax

    assert prng_key(123).tolist() == jax.random.PRNGKey(123).tolist()


def test_huge_seed_and_huge_budget(qwen3_pair, run):
    import time

    r = run("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 3, "--temperature", 1,
            "--seed", 2**70)
    assert r.returncode == 0, r.stderr
    t = time.monotonic()
    _fails(run("--ckpt", qwen3_pair.out, "--prompt", "x", "--budget", 1000000), "--budget 1000000", "context")
    assert time.monotonic() - t < 60  # the budget is checked before any tree is traced


CHAT = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant:{% endif %}")


def test_interactive_chat_keeps_the_conversation_in_the_cache(qwen3_pair, tmp_path, monkeypatch, capsys):
    """--interactive: each turn's reply is what a fresh request over the whole conversation (the
    chat template over every turn so far) generates, though only the new part is prefilled."""
    import io
    import shutil

    from ddtree_jax import cli
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.generator import Generator
    from ddtree_jax.tokenizer import Tokenizer

    ck = Path(shutil.copytree(qwen3_pair.out, tmp_path / "ck"))
    cfg_file = ck / "tokenizer" / "tokenizer_config.json"
    (ck / "tokenizer" / "chat_template.jinja").unlink(missing_ok=True)
    cfg_file.write_text(json.dumps(dict(json.loads(cfg_file.read_text()), chat_template=CHAT)))
    turns = ["def f(x):", "import os", "class A:"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(turns) + "\n"))
    starts, real = [], Generator.generate_ids
    monkeypatch.setattr(Generator, "generate_ids",
                        lambda self, prompts, **kw: starts.append((kw.get("start"), len(prompts[0]))) or
                        real(self, prompts, **kw))
    assert cli.main(["--ckpt", str(ck), "--interactive", "--system", "code", "--max-new-tokens", "8",
                     "--budget", "8", "--ignore-eos"]) == 0
    replies = capsys.readouterr().out.splitlines()
    assert len(replies) == 3
    monkeypatch.setattr(Generator, "generate_ids", real)
    # later turns prefill only what follows the part of the cached conversation they share (a reply
    # may tokenize otherwise inside the template: from there on it is prefilled again)
    assert starts[0][0] is None and all(s is not None and s >= starts[0][1] for s, _ in starts[1:]), starts
    tok = Tokenizer(ck / "tokenizer")
    gen = Generator(load_checkpoint(ck, dtype="float32"), method="ddtree", budget=8)
    messages = [{"role": "system", "content": "code"}]
    for turn, reply in zip(turns, replies):
        messages.append({"role": "user", "content": turn})
        ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        want = tok.decode(gen.generate_ids([ids], max_new_tokens=8)[0].token_ids)
        assert reply == want
        messages.append({"role": "assistant", "content": reply})


def test_hugging_face_directories_directly(qwen3_pair):
    """--target/--draft (and --ckpt naming a Hugging Face directory) read the safetensors through
    the same name table, no converted copy: the same greedy tokens as the converted checkpoint.
    The stats line reports the cold start: loading, compiling, the first token."""
    def tokens(*source, method="ddtree"):
        r = gen(*source, "--method", method, "--budget", 8, "--max-new-tokens", 10, "--json", "--prompt", "def f(x):")
        assert r.returncode == 0, r.stderr
        assert re.search(r"load \d+\.\d s, compile \d+\.\d s, first token \d+\.\d s", r.stderr), r.stderr
        return json.loads(r.stdout)["token_ids"]

    converted = tokens("--ckpt", qwen3_pair.out)
    assert len(converted) == 10
    assert tokens("--target", qwen3_pair.hf_target, "--draft", qwen3_pair.hf_draft) == converted
    assert tokens("--ckpt", qwen3_pair.hf_target, method="ar") == converted


@pytest.mark.parametrize("args, needles", [
    (("--target", "{t}", "--ckpt", "{t}"), ["--ckpt and --target both name the model"]),
    (("--draft", "{d}"), ["--draft HF_DIR goes with --target HF_DIR"]),
    (("--target", "{t}"), ["method ddtree needs a drafter", "--draft HF_DIR", "--method ar"]),
    (("--ckpt", "{t}"), ["method ddtree needs a drafter", "--target HF_DIR --draft HF_DIR"]),
    (("--target", "{missing}", "--draft", "{d}"), ["--target directory", "not found"]),
])
def test_hugging_face_directory_flag_errors(qwen3_pair, tmp_path, args, needles):
    fill = dict(t=qwen3_pair.hf_target, d=qwen3_pair.hf_draft, missing=tmp_path / "nope")
    _fails(gen(*(a.format(**fill) for a in args), "--prompt", "x", timeout=120), *needles)


def test_hugging_face_shard_missing_or_truncated(qwen2_sharded, tmp_path):
    """A shard the index lists but the directory lacks, or one cut short: one line, exit 2."""
    import shutil

    for damage in ("missing", "truncated"):
        hf = Path(shutil.copytree(qwen2_sharded.hf_target, tmp_path / damage))
        shard = sorted(hf.glob("model-*.safetensors"))[1]
        if damage == "missing":
            shard.unlink()
        else:
            shard.write_bytes(shard.read_bytes()[:-64])
        _fails(gen("--ckpt", hf, "--method", "ar", "--prompt", "x", timeout=120),
               f"lists {shard.name}" if damage == "missing" else f"{shard} is not a valid safetensors")
