"""The training recipe end to end on a tiny scale (CPU): tokenizer, target, drafter, export, convert.

One module-scoped pipeline (CLI calls in-process) is shared by the tests: tokenizer -> target
(30 steps on repetitive text) -> HF export -> drafter -> HF export. Separately, the DFlash
training pass is checked against the inference path (`extend_cache` + `draft_hidden`).
"""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from corpus import SNIPPETS, write_corpus
from ddtree_jax.train.__main__ import main as train_main

TINY_TARGET = ["--layers", "2", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
               "--intermediate", "64", "--max-position", "128"]
CPU_RUN = ["--seq-len", "32", "--compute-dtype", "float32", "--export-dtype", "float32", "--log-every", "5"]


def run_cli(*args) -> int:
    from ddtree_jax.errors import cli_main

    return cli_main(train_main, [str(a) for a in args])


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    data = write_corpus(d / "corpus.jsonl")
    assert run_cli("tokenizer", "--data", data, "--vocab-size", 300, "--out", d / "tok") == 0
    assert run_cli("target", "--data", data, "--tokenizer", d / "tok", "--out", d / "target", *TINY_TARGET, *CPU_RUN,
                   "--steps", 30, "--batch-size", 8, "--lr", 1e-2, "--warmup", 3, "--eval-every", 15,
                   "--ckpt-every", 15, "--eval-sequences", 4, "--no-keep-best") == 0
    assert run_cli("drafter", "--target", d / "target" / "hf", "--data", data, "--out", d / "draft", *CPU_RUN,
                   "--layers", 1, "--block-size", 4, "--anchors", 3, "--steps", 6, "--batch-size", 4,
                   "--warmup", 2, "--eval-every", 0, "--ckpt-every", 3, "--eval-anchors", 2,
                   "--final-eval-sequences", 4) == 0
    return d


def test_tokenizer_round_trip(pipeline):
    from ddtree_jax.train.tokenizer import EOS, MASK, load_tokenizer, mask_token_id

    tok = load_tokenizer(pipeline / "tok")
    assert len(tok) == 300 and tok.convert_ids_to_tokens([0, 1]) == [EOS, MASK]
    assert tok.eos_token_id == tok.pad_token_id == 0 and mask_token_id(tok) == 1
    for text in SNIPPETS + ["  \t odd\u00a0spacing \U0001f600\n\n\n   ", ""]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_target_loss_goes_down_and_exports(pipeline):
    m = json.loads((pipeline / "target" / "metrics.json").read_text())
    losses = [x["loss"] for x in m["metrics"]["train"]]
    assert losses[-1] < 0.75 * losses[0], losses
    assert m["final"]["step"] == 30 and m["final"]["eval_loss"] < losses[0]
    cfg = json.loads((pipeline / "target" / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["tie_word_embeddings"] and cfg["vocab_size"] == 300
    hf = pipeline / "target" / "hf"
    assert {p.name for p in hf.iterdir()} >= {"model.safetensors", "config.json", "generation_config.json",
                                               "tokenizer.json", "tokenizer_config.json"}


def test_transformers_logits_match_forward_train(pipeline):
    import torch
    import transformers

    from ddtree_jax.checkpoint import load_params
    from ddtree_jax.models.target import forward_train
    from ddtree_jax.train.drafter import load_target

    hf = pipeline / "target" / "hf"
    cfg, params = load_target(hf, "float32")
    # the export holds exactly the last training params (float32 export, --no-keep-best)
    state = load_params(pipeline / "target" / "ckpt" / "state")
    np.testing.assert_array_equal(params["embed"], state["params"]["embed"])
    np.testing.assert_array_equal(params["layers"][1]["down"], state["params"]["layers"][1]["down"])
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    except TypeError:  # transformers 4.x
        model = transformers.AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float32)
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 24))
    with torch.no_grad():
        ref = model(torch.tensor(tokens)).logits.numpy()
    ours, _ = jax.jit(lambda p, x: forward_train(p, cfg, x))(params, jnp.asarray(tokens, jnp.int32))
    scale = np.abs(ref).max()
    np.testing.assert_allclose(np.asarray(ours), ref, rtol=1e-4, atol=1e-4 * scale)


def test_resume_continues_the_step_count(pipeline, tmp_path):
    import shutil

    out = tmp_path / "target"
    shutil.copytree(pipeline / "target", out)
    data = pipeline / "corpus.jsonl"
    assert run_cli("target", "--data", data, "--tokenizer", pipeline / "tok", "--out", out, *CPU_RUN, "--steps", 35,
                   "--batch-size", 8, "--lr", 1e-2, "--warmup", 3, "--eval-every", 0, "--ckpt-every", 100,
                   "--eval-sequences", 4, "--resume") == 0
    m = json.loads((out / "metrics.json").read_text())
    steps = [x["step"] for x in m["metrics"]["train"]]
    assert steps[:6] == [1, 5, 10, 15, 20, 25] and steps[-2:] == [31, 35], steps
    assert m["final"]["step"] == 35
    assert json.loads((out / "ckpt" / "meta.json").read_text())["step"] == 35
    # without --resume an existing run is refused
    assert run_cli("target", "--data", data, "--tokenizer", pipeline / "tok", "--out", out, "--steps", 1) == 2


def test_drafter_trains_exports_and_converts(pipeline, tmp_path):
    from convert import main as convert_main
    from ddtree_jax.checkpoint import load_checkpoint

    m = json.loads((pipeline / "draft" / "metrics.json").read_text())
    final = m["final"]
    assert final["step"] == 6 and 1.0 <= final["acc_len"] <= 4.0 and 1.0 <= final["acc_len_tf"] <= 4.0
    assert len(final["top1"]) == 3 and np.isfinite(final["eval_loss"])
    cfg = json.loads((pipeline / "draft" / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["block_size"] == 4
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": 1}
    assert cfg["num_target_layers"] == 2 and cfg["layer_types"] == ["full_attention"]

    out = tmp_path / "converted"
    rc = convert_main(["--target", str(pipeline / "target" / "hf"), "--draft", str(pipeline / "draft" / "hf"),
                       "--out", str(out), "--dtype", "float32"])
    assert rc == 0
    ck = load_checkpoint(out)
    assert ck.drafter_cfg.mask_token_id == 1 and ck.drafter_cfg.target_layer_ids == (0, 1)
    assert ck.tokenizer_dir is not None
    state = __import__("ddtree_jax.checkpoint", fromlist=["load_params"]).load_params(pipeline / "draft" / "ckpt" / "state")
    np.testing.assert_array_equal(ck.drafter_params["fc"], state["params"]["fc"])


def test_training_pass_equals_inference_path():
    """train_hidden for several anchors in one pass == extend_cache + draft_hidden per anchor
    (drafter layer 0 full attention, layer 1 a sliding window shorter than some prefixes)."""
    from ddtree_jax.models.config import DrafterConfig, TargetConfig
    from ddtree_jax.drafters.dflash import draft_hidden, extend_cache
    from ddtree_jax.tuning import XLA_KERNELS
    from ddtree_jax.models.init import init_drafter, init_target
    from ddtree_jax.models.layers import KVCache
    from ddtree_jax.models.target import embed, forward_train
    from ddtree_jax.train.drafter import train_hidden

    tc = TargetConfig(family="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, rms_eps=1e-6, max_position=512, tie_embeddings=True, qk_norm=True,
                      qkv_bias=False)
    dc = DrafterConfig(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                       rms_eps=1e-6, block_size=5, target_layer_ids=(0, 2), mask_token_id=63, num_target_layers=3,
                       vocab_size=64, sliding_windows=(None, 7))
    tp, dp = init_target(tc, jax.random.PRNGKey(0)), init_drafter(dc, jax.random.PRNGKey(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 63, (2, 24)), jnp.int32)
    anchors = jnp.asarray([[1, 7, 19], [3, 4, 12]], jnp.int32)
    bs, t = dc.block_size, tokens.shape[1]

    @jax.jit
    def both(tp, dp):
        _, taps = forward_train(tp, tc, tokens, taps=dc.target_layer_ids)
        h = train_hidden(dp, dc, tp, taps, tokens, anchors)  # [2, 3, bs, H]
        # Inference, one row per anchor: the cache is filled with all T context positions, and
        # cache_len = a hides every position >= a, as the engine's cache contract says.
        rows = jnp.repeat(jnp.arange(2), 3)
        a = anchors.reshape(-1)
        cache = KVCache.zeros(dc.num_layers, 6, dc.num_kv_heads, t, dc.head_dim, jnp.float32)
        pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (6, t))
        cache = extend_cache(dp, dc, cache, jnp.zeros((6,), jnp.int32), taps[rows], pos)
        offs = jnp.arange(bs, dtype=jnp.int32)
        block = jnp.where(offs == 0, tokens[rows, a][:, None], dc.mask_token_id)
        ref = draft_hidden(dp, dc, embed(tp, block), a[:, None] + offs, cache, a, kernels=XLA_KERNELS)
        return h.reshape(6, bs, -1), ref

    h, ref = both(tp, dp)
    np.testing.assert_allclose(np.asarray(h), np.asarray(ref), atol=1e-5, rtol=1e-5)


def test_packed_batches_are_deterministic():
    from ddtree_jax.train.data import PackedData

    docs = [np.arange(i * 100, i * 100 + 37 + i, dtype=np.int32) for i in range(20)]
    a, b = PackedData(docs, 16, 4, seed=3), PackedData(docs, 16, 4, seed=3)
    for step in (0, 1, a.steps_per_epoch, a.steps_per_epoch + 2, 5 * a.steps_per_epoch):
        np.testing.assert_array_equal(a.batch(step), b.batch(step))
    assert not np.array_equal(a.batch(0), a.batch(a.steps_per_epoch))  # each epoch re-packs


def test_schedule_warmup_and_cosine():
    from ddtree_jax.train import Schedule

    s = Schedule(1.0, 10, 0.1)
    assert s(0, 100) == pytest.approx(0.1) and s(9, 100) == pytest.approx(1.0)
    assert s(10, 100) == pytest.approx(1.0) and s(100, 100) == pytest.approx(0.1)
    assert s(55, 100) == pytest.approx(0.55)


def test_interrupt_keeps_last_checkpoint(tmp_path, capsys):
    from ddtree_jax.train import LoopConfig, RunDir, Schedule, train_loop

    run = RunDir(tmp_path / "out", resume=False, force=False)
    params = {"w": jnp.ones((3,))}

    def step_fn(p, o, batch, lr):
        if batch == 3:
            raise KeyboardInterrupt
        return p, o, jnp.float32(1.0)

    def checkpoint(p, o, step, planned):
        run.save(p, o, {"kind": "target", "step": step})

    cfg = LoopConfig(steps=10, time_budget=None, schedule=Schedule(1e-3, 1, 0.1), log_every=1, eval_every=0,
                     ckpt_every=2, tokens_per_step=1)
    with pytest.raises(KeyboardInterrupt):
        train_loop(cfg=cfg, params=params, opt_state=(), start_step=0, step_fn=step_fn, batch_at=lambda s: s,
                   evaluate=None, checkpoint=checkpoint, metrics={"train": [], "eval": []}, write_metrics=lambda: None,
                   last_ckpt_step=None, ckpt_dir=run.ckpt)
    err = capsys.readouterr().err
    assert "interrupted at step 3" in err and "step 2" in err and "--resume" in err
    assert json.loads((run.ckpt / "meta.json").read_text())["step"] == 2
    assert sorted(p.name for p in run.out.iterdir()) == ["ckpt"]  # no temporary leftovers


@pytest.mark.parametrize("signals", [1, 2])
def test_a_signal_stops_the_loop_at_a_step_boundary(signals, tmp_path, capsys):
    """One SIGINT (or SIGTERM) in a step: the step finishes, its checkpoint is written, and the loop
    raises before the next step. A second one raises at once, inside the step."""
    import os
    import signal

    from ddtree_jax.train import LoopConfig, RunDir, Schedule, train_loop

    run = RunDir(tmp_path / "out", resume=False, force=False)
    seen = []

    def step_fn(p, o, batch, lr):
        seen.append(batch)
        if batch == 3:
            for s in (signal.SIGINT, signal.SIGTERM)[:signals]:
                os.kill(os.getpid(), s)
        return p, o, jnp.float32(1.0)

    def checkpoint(p, o, step, planned):
        run.save(p, o, {"kind": "target", "step": step})

    cfg = LoopConfig(steps=10, time_budget=None, schedule=Schedule(1e-3, 1, 0.1), log_every=1, eval_every=0,
                     ckpt_every=2, tokens_per_step=1)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        train_loop(cfg=cfg, params={"w": jnp.ones((3,))}, opt_state=(), start_step=0, step_fn=step_fn,
                   batch_at=lambda s: s, evaluate=None, checkpoint=checkpoint, metrics={"train": [], "eval": []},
                   write_metrics=lambda: None, last_ckpt_step=None, ckpt_dir=run.ckpt)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    err = capsys.readouterr().err
    stopped, ckpt = (4, 4) if signals == 1 else (3, 2)
    assert seen == [0, 1, 2, 3] and f"interrupted at step {stopped}" in err and f"(step {ckpt})" in err, err
    assert json.loads((run.ckpt / "meta.json").read_text())["step"] == ckpt


@pytest.mark.parametrize("case", ["no_data", "empty_data", "no_tokenizer", "not_qwen3", "no_target"])
def test_cli_errors_are_one_line(case, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    data = write_corpus(tmp_path / "c.jsonl", 4, 1)
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    args, expect = {
        "no_data": (["tokenizer", "--data", tmp_path / "nope.jsonl", "--out", tmp_path / "t"], "not found"),
        "empty_data": (["tokenizer", "--data", empty, "--out", tmp_path / "t"], "no non-empty documents"),
        "no_tokenizer": (["target", "--data", data, "--tokenizer", tmp_path / "none", "--out", tmp_path / "o"],
                         "tokenizer"),
        "not_qwen3": (["drafter", "--target", llama, "--data", data, "--out", tmp_path / "o"], "not a Qwen3"),
        "no_target": (["drafter", "--target", tmp_path / "none", "--data", data, "--out", tmp_path / "o"], "not found"),
    }[case]
    assert run_cli(*args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err
    assert not (tmp_path / "t").exists() and not (tmp_path / "o").exists()


def _diverging_loop(tmp_path, *, nan_loss_from: int | None = None, inf_weights_from: int | None = None, **cfg):
    """train_loop over a toy step whose loss turns NaN (or whose weights turn Inf, the loss staying
    finite) from batch `..._from` on; returns (the UserError, the run directory)."""
    from ddtree_jax.errors import UserError
    from ddtree_jax.train import LoopConfig, RunDir, Schedule, train_loop

    run = RunDir(tmp_path / "out", resume=False, force=False)
    written = []

    def step_fn(p, o, batch, lr):
        if inf_weights_from is not None and batch >= inf_weights_from:
            p = {"w": p["w"] * jnp.inf}
        loss = jnp.float32(jnp.nan if nan_loss_from is not None and batch >= nan_loss_from else 1.0)
        return p, o, loss

    def checkpoint(p, o, step, planned):
        run.save(p, o, {"kind": "target", "step": step})

    loop = LoopConfig(**{**dict(steps=20, time_budget=None, schedule=Schedule(1e-3, 1, 0.1), log_every=10,
                                eval_every=0, ckpt_every=2, tokens_per_step=1), **cfg})
    with pytest.raises(UserError) as e:
        train_loop(cfg=loop, params={"w": jnp.ones((3,))}, opt_state=(), start_step=0, step_fn=step_fn,
                   batch_at=lambda s: s, evaluate=lambda p, s: {"eval_loss": 1.0}, checkpoint=checkpoint,
                   metrics={"train": [], "eval": []}, write_metrics=lambda: written.append(1),
                   last_ckpt_step=None, ckpt_dir=run.ckpt)
    assert written, "the metrics were not written before stopping"
    return str(e.value), run


def test_a_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    """The loss of step 6 (between log lines) is NaN: the checkpoint due at step 6 is not written,
    the one of step 4 stays, and the one line names step 6 and that checkpoint."""
    msg, run = _diverging_loop(tmp_path, nan_loss_from=5)
    assert msg.startswith("training diverged: the loss is nan at step 6; lower --lr") and "\n" not in msg, msg
    assert f"the last good checkpoint (step 4) is in {run.ckpt}; --resume continues from it" in msg, msg
    assert json.loads((run.ckpt / "meta.json").read_text())["step"] == 4
    assert sorted(p.name for p in run.out.iterdir()) == ["ckpt"]  # no temporary leftovers
    # found at a log line, with no checkpoint and no eval in between; and before an eval
    msg, _ = _diverging_loop(tmp_path / "b", nan_loss_from=2, ckpt_every=0, log_every=7)
    assert "the loss is nan at step 3; lower --lr or check the data; no checkpoint was written yet" in msg, msg
    msg, _ = _diverging_loop(tmp_path / "c", nan_loss_from=4, ckpt_every=0, eval_every=5)
    assert "the loss is nan at step 5;" in msg, msg


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    """Weights that turn Inf at step 3 while the loss stays finite: the checkpoint of step 4 is
    refused (the one of step 2 stays); without checkpoints the end of the loop refuses them."""
    msg, run = _diverging_loop(tmp_path, inf_weights_from=2)
    assert msg.startswith("training diverged: the weights hold NaN or Inf after step 4;") and "(step 2)" in msg, msg
    assert json.loads((run.ckpt / "meta.json").read_text())["step"] == 2
    msg, _ = _diverging_loop(tmp_path / "b", inf_weights_from=18, ckpt_every=0, log_every=100)
    assert "the weights hold NaN or Inf after step 20;" in msg, msg


def test_a_diverging_run_keeps_the_checkpoint_it_resumed_from(pipeline, tmp_path, capsys):
    """The pipeline's target resumed with an absurd learning rate: exit 2, one line naming the step
    where the loss stopped being finite, and the step-30 checkpoint and the export unchanged."""
    import re
    import shutil

    out = tmp_path / "target"
    shutil.copytree(pipeline / "target", out)
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "metrics.json"}
    capsys.readouterr()
    assert run_cli("target", "--data", pipeline / "corpus.jsonl", "--tokenizer", pipeline / "tok", "--out", out,
                   *CPU_RUN, "--steps", 40, "--batch-size", 8, "--lr", 1e30, "--warmup", 1, "--eval-every", 0,
                   "--ckpt-every", 100, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("ddtree_jax.train: error: training diverged: "), err
    step = re.search(r"(?:at|after) step (\d+);", err)
    assert step and 30 < int(step[1]) <= 40, err
    assert f"the last good checkpoint (step 30) is in {out / 'ckpt'}; --resume continues from it" in err, err
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and p.name != "metrics.json"} == before


@pytest.fixture(scope="module")
def small_tokenizer(tmp_path_factory):
    from ddtree_jax.train.tokenizer import save_tokenizer, train_tokenizer

    d = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(SNIPPETS * 10, 300), d)
    return d


@pytest.mark.parametrize("command, flags, needle", [
    ("target", ["--lr", "nan"], "--lr must be a finite number > 0, got nan"),
    ("target", ["--lr", "inf"], "--lr must be a finite number > 0, got inf"),
    ("target", ["--min-lr-ratio", "1.5"], "--min-lr-ratio must be in [0, 1]"),
    ("target", ["--min-lr-ratio", "nan"], "--min-lr-ratio must be in [0, 1]"),
    ("target", ["--weight-decay", "-0.1"], "--weight-decay must be a finite number >= 0"),
    ("target", ["--grad-clip", "inf"], "--grad-clip must be a finite number >= 0"),
    ("target", ["--time-budget", "nan"], "--time-budget must be a finite number of seconds > 0"),
    ("target", ["--rope-theta", "nan"], "--rope-theta must be a finite number > 0"),
    ("drafter", ["--gamma", "nan"], "--gamma must be a finite number > 0"),
    ("drafter", ["--head-dim", "-16"], "--head-dim must be positive"),
    ("drafter", ["--head-dim", "15"], "--head-dim must be even"),
])
def test_non_finite_and_out_of_range_options_are_one_line(small_tokenizer, tmp_path, capsys, command, flags, needle):
    """Refused before any data is tokenized or anything written; the drafter's shape options need
    only the target's config.json to be checked."""
    data = write_corpus(tmp_path / "c.jsonl", 4, 1)
    target = tmp_path / "hf"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 64, "tie_word_embeddings": True}))
    where = ["--tokenizer", small_tokenizer] + (["--target", target] if command == "drafter" else [])
    capsys.readouterr()
    assert run_cli(command, "--data", data, *where, "--out", tmp_path / "o", "--seq-len", 32, *flags) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and needle in err, err
    assert not (tmp_path / "o").exists()
