"""Robustness: the generate CLI's error contract beyond tests/test_generate_cli.py, an end-to-end
losslessness fuzz over random tiny models, and run-to-run determinism of seeded sampling.

Error contract (real CLI, subprocess): exit 2, exactly one non-empty stderr line naming the
problem, no traceback. Cases already covered elsewhere are not repeated here:
tests/test_generate_cli.py (negative budget / temperature, top-p out of (0, 1], unknown policy, a
static tree missing a parent, empty prompt and prompt files, context overflow by max-new-tokens,
a budget over the cache, missing checkpoint, HF dir given as a checkpoint, no drafter, memory
limit) and tests/test_convert.py (corrupt safetensors, output exists without --force, misfit
drafters at conversion time). The cases under "failed when written" gave tracebacks, several lines
or a hang when these tests were written; generate.py/errors.py were fixed in 5d74222.

End-to-end fuzz (in-process, hypothesis): random tiny target/drafter pairs (family, layers, GQA
ratios, head dims, vocab, block size, draft layers, sliding windows, taps, mask id), every tree
policy (a random valid static tree included) and DFlash, random budgets, ragged batches,
max_new_tokens and stop ids, random or oracle drafters; the greedy output must equal plain AR.
Compilation dominates (a few s per config), so CI runs `DDTREE_FUZZ_EXAMPLES` (default 4) examples
from a fixed seed (derandomize); `DDTREE_FUZZ_EXAMPLES=200 pytest tests/test_robustness.py -k fuzz`
is the long run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from conftest import FAST_COMPILE

from ddtree_jax.generator import Generator
from ddtree_jax.models.config import DrafterConfig, TargetConfig
from ddtree_jax.models.init import init_drafter, init_target

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = int(os.environ.get("DDTREE_FUZZ_EXAMPLES", "4"))


# =============================================================================================
# End-to-end losslessness fuzz


def FastGenerator(*args, **kwargs) -> Generator:
    """A `Generator` whose executables compile with FAST_COMPILE."""
    return Generator(*args, compiler_options=FAST_COMPILE, **kwargs)


FAMILIES = {"qwen3": (True, False), "llama": (False, False), "qwen2": (False, True)}  # qk_norm, qkv_bias


@st.composite
def static_trees(draw, depth: int) -> str:
    """A random valid static tree: prefix-closed rank paths of depth <= `depth`, parents first."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(1, 12))):
        parent = draw(st.sampled_from([()] + [p for p in paths if len(p) < depth]))
        child = parent + (draw(st.integers(0, 3)),)
        if child not in paths:
            paths.append(child)
    return ";".join(".".join(map(str, p)) for p in paths)


@st.composite
def configs(draw):
    family = draw(st.sampled_from(sorted(FAMILIES)))
    layers = draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([8, 16]))
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2, 4]))
    vocab = draw(st.integers(16, 128))
    hidden = draw(st.sampled_from([16, 32]))
    qk_norm, qkv_bias = FAMILIES[family]
    tcfg = TargetConfig(family=family, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, rms_eps=1e-6,
                        max_position=4096, tie_embeddings=draw(st.booleans()), qk_norm=qk_norm, qkv_bias=qkv_bias,
                        architecture={"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                                      "qwen2": "Qwen2ForCausalLM"}[family])
    block = draw(st.integers(2, 9))
    dlayers = draw(st.integers(1, 2))
    d_kv = draw(st.sampled_from([1, 2]))
    windows = tuple(draw(st.one_of(st.none(), st.integers(block, block + 12))) for _ in range(dlayers))
    taps = tuple(draw(st.lists(st.integers(0, layers - 1), min_size=1, max_size=3, unique=True)))
    dcfg = DrafterConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_layers=dlayers,
                         num_heads=d_kv * draw(st.sampled_from([1, 2, 4])), num_kv_heads=d_kv,
                         head_dim=draw(st.sampled_from([8, 16])), rms_eps=1e-6, block_size=block,
                         target_layer_ids=taps, mask_token_id=draw(st.integers(0, vocab - 1)),
                         num_target_layers=layers, vocab_size=vocab, sliding_windows=windows)
    kind = draw(st.sampled_from(["ddtree", "chain", "beam", "static", "dflash"]))
    policy = {"ddtree": "ddtree", "chain": "chain", "dflash": "chain",
              "beam": f"beam:width={draw(st.integers(1, 4))}" if kind == "beam" else "",
              "static": f"static:tree={draw(static_trees(block - 1))}" if kind == "static" else ""}[kind]
    batch = draw(st.integers(1, 3))
    prompts = [draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=20)) for _ in range(batch)]
    return types.SimpleNamespace(
        tcfg=tcfg, dcfg=dcfg, method="dflash" if kind == "dflash" else "ddtree", policy=policy,
        budget=draw(st.integers(1, 40)), prompts=prompts, max_new=draw(st.integers(1, 24)),
        stop=draw(st.one_of(st.none(), st.integers(0, 23))),  # index into row 0's AR output
        drafter=draw(st.sampled_from(["random", "oracle", "noisy"])), seed=draw(st.integers(0, 2**16)))


def make_pair(c) -> types.SimpleNamespace:
    if os.environ.get("DDTREE_FUZZ_VERBOSE"):  # which example is running (a crash names none)
        print(f"fuzz example: {c}", file=sys.stderr, flush=True)
    tp = init_target(c.tcfg, jax.random.PRNGKey(c.seed))
    if "lm_head" in tp:
        tp["lm_head"] = tp["lm_head"] * 4.0  # sharper logits, as in tests/tiny.py
    dp = init_drafter(c.dcfg, jax.random.PRNGKey(c.seed + 1))
    return types.SimpleNamespace(target_cfg=c.tcfg, target_params=tp, drafter_cfg=c.dcfg, drafter_params=dp,
                                 tokenizer_dir=None, meta={})


def oracle_from(pair, prompts, continuations, noise: float, seed: int) -> dict:
    """Oracle drafter params (drafters/oracle.py) from the target's own greedy continuations."""
    length = max(len(p) + len(r) for p, r in zip(prompts, continuations)) + 1
    tokens = np.zeros((len(prompts), length), np.int32)
    for i, (p, r) in enumerate(zip(prompts, continuations)):
        tokens[i, : len(p) + len(r)] = list(p) + list(r)
    params = {"tokens": jnp.asarray(tokens), "strength": jnp.float32(30.0 if noise == 0 else 1.0)}
    if noise:
        v = pair.target_cfg.vocab_size
        params["noise"] = noise * jax.random.normal(jax.random.PRNGKey(seed), (len(prompts), length, v))
    return params


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=configs())
def test_fuzz_speculative_equals_autoregressive(c):
    try:
        check_lossless(c)
    finally:
        # Every example compiles new executables and jax keeps them all (~850 memory maps per
        # example), so ~100 examples reach vm.max_map_count (65530) and LLVM aborts ("Cannot
        # allocate memory") or segfaults mid-compile. Clearing the caches keeps the count flat.
        jax.clear_caches()


def check_lossless(c) -> None:
    pair = make_pair(c)
    ar = FastGenerator(pair, method="ar")
    depth = c.dcfg.depth
    # The AR reference, long enough for an oracle drafter to look D + 1 tokens past max_new.
    long = ar.generate_ids(c.prompts, max_new_tokens=c.max_new + depth + 2)
    full = [r.token_ids for r in long]
    assert all(len(t) == c.max_new + depth + 2 for t in full)
    stop_ids = [] if c.stop is None else [full[0][min(c.stop, c.max_new - 1)]]
    want = []
    for t in full:
        t = t[: c.max_new]
        cut = next((i + 1 for i, x in enumerate(t) if x in stop_ids), len(t))
        want.append(t[:cut])
    oracle = None
    if c.drafter != "random":
        oracle = oracle_from(pair, c.prompts, full, 1.5 if c.drafter == "noisy" else 0.0, c.seed)
    gen = FastGenerator(pair, method=c.method, policy=c.policy, budget=c.budget, oracle=oracle)
    res = gen.generate_ids(c.prompts, max_new_tokens=c.max_new, stop_ids=stop_ids)
    got = [r.token_ids for r in res]
    assert got == want, (c, got, want)
    for r, w in zip(res, want):
        assert r.num_output_tokens == len(w)
        # every round commits >= 1 token; together they give the output after the prefill's first
        assert all(1 <= a <= depth + 1 for a in r.acceptance_lengths), r.acceptance_lengths
        assert sum(r.acceptance_lengths) >= len(w) - 1
        if c.drafter == "oracle" and not c.policy.startswith("static") and gen.budget >= depth:
            # a perfect drafter is accepted to full depth in every round but (maybe) the last
            assert all(a == depth + 1 for a in r.acceptance_lengths[:-1]), r.acceptance_lengths


# =============================================================================================
# The generate CLI's error contract: what tests/test_generate_cli.py does not cover


def gen(*args, env=None, timeout=180) -> subprocess.CompletedProcess:
    e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "ddtree_jax.generate", *map(str, args)], cwd=ROOT, env=e,
                          capture_output=True, text=True, timeout=timeout)


def fails(r: subprocess.CompletedProcess, *needles: str) -> str:
    """Exit 2, one non-empty stderr line starting with the program's name, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert lines[0].startswith("ddtree_jax.generate: error: "), lines[0]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def variant(src: Path, dst: Path, *, target=None, draft=None, meta=None) -> Path:
    """A copy of the converted checkpoint `src` with its target/draft config.json or ddtree.json edited
    (each a function that changes the parsed JSON in place)."""
    shutil.copytree(src, dst)
    for edit, f in ((target, dst / "target" / "config.json"), (draft, dst / "draft" / "config.json"),
                    (meta, dst / "ddtree.json")):
        if edit is not None:
            obj = json.loads(f.read_text())
            edit(obj)
            f.write_text(json.dumps(obj))
    return dst


# --------------------------------------------------------------------------- paths


def test_checkpoint_is_a_file(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0" * 8)
    fails(gen("--ckpt", f, "--prompt", "x"), str(f), "not a directory", "python -m convert")


def test_prompt_file_not_utf8(qwen3_pair, tmp_path):
    f = tmp_path / "p.txt"
    f.write_bytes(b"\xff\xfe\xfa bad\n")
    fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", f), "cannot read prompt file", str(f))


def test_prompt_file_is_a_directory(qwen3_pair, tmp_path):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", tmp_path), "prompt file", str(tmp_path))


def test_checkpoint_without_tokenizer(llama_target):
    fails(gen("--ckpt", llama_target.out, "--method", "ar", "--prompt", "x"), "no tokenizer")


# --------------------------------------------------------------------------- the checkpoint itself


def test_unknown_checkpoint_format(qwen3_pair, tmp_path):
    ck = variant(qwen3_pair.out, tmp_path / "ck", meta=lambda m: m.update(format=99))
    fails(gen("--ckpt", ck, "--prompt", "x"), "format 99", "convert the model again")


def test_unsupported_target_architecture(qwen3_pair, tmp_path):
    ck = variant(qwen3_pair.out, tmp_path / "ck", target=lambda c: c.update(architectures=["MambaForCausalLM"]))
    fails(gen("--ckpt", ck, "--prompt", "x"), "'MambaForCausalLM' is not supported", "Qwen3ForCausalLM")


def test_unsupported_drafter_architecture(qwen3_pair, tmp_path):
    def edit(c):
        c.pop("dflash_config")
        c["architectures"] = ["EagleDraftModel"]

    ck = variant(qwen3_pair.out, tmp_path / "ck", draft=edit)
    fails(gen("--ckpt", ck, "--prompt", "x"), "drafter architecture 'EagleDraftModel' is not supported", "DFlash")


def test_drafter_that_does_not_fit_the_target(qwen3_pair, tmp_path):
    """Hidden size, vocabulary, tapped layers and mask id, all named on the one line."""
    def edit(c):
        c.update(hidden_size=32, vocab_size=500, dflash_config={"target_layer_ids": [1, 9], "mask_token_id": 9999})

    ck = variant(qwen3_pair.out, tmp_path / "ck", draft=edit)
    fails(gen("--ckpt", ck, "--prompt", "x"), "the drafter does not fit the target", "hidden size 32 != target's 64",
          "vocab size 500 != target's 384", "tapped layers [9]", "mask token id 9999")


@pytest.mark.parametrize("misfit, needle", [
    (dict(hidden_size=32), "hidden size 32 != target's 64"),
    (dict(vocab_size=500), "vocab size 500 != target's 384"),
    (dict(dflash_config={"target_layer_ids": [0, 4], "mask_token_id": 5}), "tapped layers [4] are outside"),
    (dict(dflash_config={"target_layer_ids": [1, 2], "mask_token_id": 384}), "mask token id 384 is outside"),
    (dict(dflash_config={"target_layer_ids": [1, 2], "mask_token_id": -1}), "mask token id -1 is outside"),
])
def test_load_checkpoint_rejects_a_misfit_drafter(qwen3_pair, tmp_path, misfit, needle):
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.errors import UserError
    from ddtree_jax.models.config import ConfigError

    ck = variant(qwen3_pair.out, tmp_path / "ck", draft=lambda c: c.update(misfit))
    with pytest.raises((UserError, ConfigError)) as e:
        load_checkpoint(ck)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)
    load_checkpoint(ck, with_drafter=False)  # the target alone is still usable (--method ar)


def test_load_checkpoint_rejects_drafter_params_of_another_shape(qwen3_pair, tmp_path):
    """A config that fits but params that do not (a drafter saved for 3 tapped layers)."""
    from safetensors.numpy import load_file, save_file

    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.errors import UserError

    ck = variant(qwen3_pair.out, tmp_path / "ck")
    params = load_file(ck / "draft" / "params.safetensors")
    params["fc"] = np.zeros((3 * params["fc"].shape[1], params["fc"].shape[1]), np.float32)
    save_file(params, ck / "draft" / "params.safetensors")
    with pytest.raises(UserError, match=r"param 'fc' has shape \[192, 64\], expected \[128, 64\]") as e:
        load_checkpoint(ck)
    assert "\n" not in str(e.value)


def test_drafter_block_size_1(qwen3_pair, tmp_path):
    ck = variant(qwen3_pair.out, tmp_path / "ck", draft=lambda c: c.update(block_size=1))
    fails(gen("--ckpt", ck, "--prompt", "x"), "block_size is 1", "at least 2")


def test_drafter_window_shorter_than_its_block(qwen3_pair, tmp_path):
    ck = variant(qwen3_pair.out, tmp_path / "ck", draft=lambda c: c.update(
        layer_types=["sliding_attention", "full_attention"], sliding_window=4))
    fails(gen("--ckpt", ck, "--prompt", "x"), "sliding_window 4 is shorter than block_size 8")


def test_prompt_longer_than_the_context(qwen3_pair, tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("def f(x): return x + 1 " * 200 + "\n")  # thousands of tokens; the context is 512
    line = fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", f, "--max-new-tokens", 1),
                 "exceeds the model's context of 512 tokens", "shorten the prompt")
    assert int(line.split("the prompt (")[1].split()[0]) > 512


# --------------------------------------------------------------------------- options (checked before loading)


@pytest.mark.parametrize("args, needles", [
    (("--max-new-tokens", 0), ("--max-new-tokens", ">= 1")),
    (("--top-k", -1), ("--top-k", ">= 0")),
    (("--temperature", "nan"), ("--temperature",)),
    (("--tree-policy", "static:tree=0;a"), ("bad node 'a'",)),
    (("--tree-policy", "static:tree=0;1;0"), ("appears twice",)),
    (("--tree-policy", "static"), ("needs option(s) tree",)),
    (("--tree-policy", "beam:width=0"), ("beam width", ">= 1")),
])
def test_bad_option_values(qwen3_pair, args, needles):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4, *args), *needles)


# --------------------------------------------------------------------------- failed when written; fixed in 5d74222


DEPTH_8 = ";".join(".".join("0" * d) for d in range(1, 9))  # 0;0.0;...: the drafter's depth is 7


@pytest.mark.parametrize("tree, needle", [
    (DEPTH_8, "deeper than the drafter's 7 positions"),
    ("400", "rank >= the vocabulary size 384"),
])
def test_static_tree_that_does_not_fit_the_drafter(qwen3_pair, tree, needle):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4, "--tree-policy", f"static:tree={tree}"),
          needle)


@pytest.mark.parametrize("args, needle", [(("--method", "fast"), "invalid choice: 'fast'"),
                                          (("--budget", "many"), "expected a number of draft nodes or auto, got 'many'")])
def test_argparse_errors_are_one_line(args, needle):
    fails(gen("--prompt", "x", *args), args[0], needle, "--help")


def test_unknown_attention_implementation(qwen3_pair):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4, "--attn-impl", "bogus"),
          "--attn-impl 'bogus'", "xla")


@pytest.mark.parametrize("args, needle", [
    (("--matmul-impl", "pallas"), "--matmul-impl 'pallas'; available here"),   # no Triton on the CPU
    (("--cache-impl", "pallas"), "--cache-impl 'pallas'; available here"),
    (("--method", "ar", "--drafter-quant", "int8"), "needs a DFlash drafter"),
])
def test_kernel_and_drafter_options_that_cannot_run_here(qwen3_pair, args, needle):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4, *args), needle)


def test_jsonl_prompt_that_is_not_a_string(qwen3_pair, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps({"prompt": 5}) + "\n")
    fails(gen("--ckpt", qwen3_pair.out, "--prompt-file", f, "--max-new-tokens", 4), f"{f}:2", "string")


def test_bad_memory_limit_variable(qwen3_pair):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4,
              env={"DDTREE_MEMORY_LIMIT_BYTES": "lots"}), "DDTREE_MEMORY_LIMIT_BYTES", "'lots'")


def test_rounds_per_call_below_one(qwen3_pair):
    """It used to loop forever while streaming (no round ever ran)."""
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4, "--rounds-per-call", -1, timeout=60),
          "--rounds-per-call", ">= 1")


def test_negative_unroll(qwen3_pair):
    fails(gen("--ckpt", qwen3_pair.out, "--prompt", "x", "--max-new-tokens", 4, "--unroll", -2, timeout=60),
          "--unroll", ">= 0")


def test_corrupt_converted_params(qwen3_pair, tmp_path):
    """The one line only (an orbax restore's aborted callbacks once printed tracebacks after it)."""
    ck = variant(qwen3_pair.out, tmp_path / "ck")
    f = ck / "target" / "params.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    fails(gen("--ckpt", ck, "--prompt", "x"), str(f), "not a valid safetensors file", "convert it again")


def test_closed_loop_callbacks_during_a_failed_restore_print_nothing(tmp_path, monkeypatch, capfd):
    """The deterministic form of the race above: an aborted read's callback that hits orbax's closed
    event loop WHILE the restore is still failing (before our except block runs) must print
    nothing, so the filters must be in place before the restore starts."""
    import orbax.checkpoint as ocp

    from ddtree_jax import checkpoint
    from ddtree_jax.errors import UserError

    class Callback:  # reports its error as unraisable, as the C++ callback's does
        def __del__(self):
            raise RuntimeError("Event loop is closed")

    def failing_restore(self, *a, **k):
        Callback()
        raise ValueError("OUT_OF_RANGE: Error reading ... (a corrupt file)")

    reported = []  # what reaches the hook below the filters (the printing default, in a CLI run)
    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", failing_restore)
    monkeypatch.setattr(checkpoint, "_SILENCED", False, raising=False)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # restored afterwards
    import threading
    monkeypatch.setattr(threading, "excepthook", threading.excepthook)
    (tmp_path / "params").mkdir()
    with pytest.raises(UserError, match="cannot restore"):
        checkpoint.load_params(tmp_path / "params")
    assert reported == []
    assert "Traceback" not in capfd.readouterr().err


# =============================================================================================
# Determinism of sampling, run to run (the shipped pair)


def test_seeded_sampling_is_identical_across_processes(tmp_path):
    """Three processes, seeds 7, 7 and 8 (temperature 1, top-p 0.95). The first runs alone and fills a compilation cache of
    its own; the other two run together from it (as a user's later runs do), so the programs
    compile once instead of three times at once (48 -> 30 CPU seconds)."""
    args = ("--json", "--temperature", 1, "--top-p", 0.95, "--max-new-tokens", 32, "--prompt", "def fib(n):")
    e = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT), DDTREE_COMPILE_CACHE=str(tmp_path / "xla"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")

    def start(seed):
        return subprocess.Popen([sys.executable, "-m", "ddtree_jax.generate", *map(str, args), "--seed", str(seed)],
                                cwd=ROOT, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(p):
        so, se = p.communicate(timeout=300)
        assert p.returncode == 0, se
        return json.loads(so)["token_ids"]

    outs = [finish(start(7))]
    outs += [finish(p) for p in [start(7), start(8)]]
    assert len(outs[0]) == 32 and outs[0] == outs[1]
    assert outs[2] != outs[0]  # seed 8: checked to differ from seed 7 from the first tokens on


def test_aborted_reads_are_not_logged_after_the_error(caplog):
    """After a failed restore its other reads' never-retrieved task errors stay out of the log
    (they are the error already reported); asyncio's other records do not."""
    import logging

    from ddtree_jax.checkpoint import _quiet_aborted_reads

    _quiet_aborted_reads()
    log = logging.getLogger("asyncio")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        log.error("Task exception was never retrieved\nfuture: <Task finished name='Task-50'>")
        log.error("Unclosed client session")
    assert [r.getMessage() for r in caplog.records] == ["Unclosed client session"]
