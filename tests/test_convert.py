"""Conversion of HF checkpoints: exact params in our layout, and the CLI's error contract."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from conftest import ROOT, convert_cli
from hf_fixtures import make_drafter, make_target

from ddtree_jax.checkpoint import load_checkpoint, save_checkpoint
from ddtree_jax.errors import UserError

# ---------------------------------------------------------------------------------------------
# Our layout, written out independently of ddtree_jax/checkpoint/names.py: HF name pattern -> (key, transpose).

_LAYER = {
    "input_layernorm.weight": ("attn_norm", False),
    "self_attn.q_proj.weight": ("q", True), "self_attn.k_proj.weight": ("k", True),
    "self_attn.v_proj.weight": ("v", True), "self_attn.o_proj.weight": ("o", True),
    "self_attn.q_proj.bias": ("q_bias", False), "self_attn.k_proj.bias": ("k_bias", False),
    "self_attn.v_proj.bias": ("v_bias", False), "self_attn.o_proj.bias": ("o_bias", False),
    "self_attn.q_norm.weight": ("q_norm", False), "self_attn.k_norm.weight": ("k_norm", False),
    "post_attention_layernorm.weight": ("mlp_norm", False),
    "mlp.gate_proj.weight": ("gate", True), "mlp.up_proj.weight": ("up", True), "mlp.down_proj.weight": ("down", True),
}
_TOP = {"model.embed_tokens.weight": ("embed", False), "model.norm.weight": ("norm", False),
        "lm_head.weight": ("lm_head", True), "fc.weight": ("fc", True), "hidden_norm.weight": ("hidden_norm", False),
        "norm.weight": ("norm", False)}


def hf_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    """All tensors of a HF directory as float32 numpy (via torch, which reads bf16 too)."""
    from safetensors.torch import load_file

    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update({k: v.float().numpy() for k, v in load_file(f).items()})
    return out


def expected_params(model_dir: Path, *, tied: bool = False) -> dict[str, np.ndarray]:
    """Dotted key ("layers.3.q") -> array in our layout."""
    out = {}
    for name, t in hf_tensors(model_dir).items():
        if tied and name == "lm_head.weight":
            continue
        m = re.fullmatch(r"(?:model\.)?layers\.(\d+)\.(.+)", name)
        if not m and name not in _TOP:
            name = name.removeprefix("model.")  # a prefixed drafter
        key, transpose = (f"layers.{m[1]}.{_LAYER[m[2]][0]}", _LAYER[m[2]][1]) if m else _TOP[name]
        out[key] = t.T if transpose else t
    return out


def flatten(params) -> dict[str, np.ndarray]:
    out = {}
    for k, v in params.items():
        if k == "layers":
            assert isinstance(v, list), "layers must come back as a list"
            for i, layer in enumerate(v):
                out.update({f"layers.{i}.{n}": a for n, a in layer.items()})
        else:
            out[k] = v
    return out


def assert_params_equal(params, expected: dict[str, np.ndarray], dtype=np.float32) -> None:
    got = flatten(params)
    assert sorted(got) == sorted(expected)
    for k, want in expected.items():
        assert isinstance(got[k], np.ndarray) and got[k].dtype == dtype, (k, type(got[k]), got[k].dtype)
        np.testing.assert_array_equal(got[k], want.astype(dtype), err_msg=k)


# ---------------------------------------------------------------------------------------------
# Exact conversion


def test_qwen3_pair_untied_with_drafter(qwen3_pair):
    ck = load_checkpoint(qwen3_pair.out)
    assert ck.target_cfg.family == "qwen3" and not ck.target_cfg.tie_embeddings
    assert_params_equal(ck.target_params, expected_params(qwen3_pair.hf_target))
    assert "lm_head" in ck.target_params and "q_norm" in ck.target_params["layers"][0]
    assert ck.drafter_cfg.target_layer_ids == (1, 2) and ck.drafter_cfg.block_size == 8
    assert_params_equal(ck.drafter_params, expected_params(qwen3_pair.hf_draft))
    assert ck.drafter_params["fc"].shape == (2 * 64, 64)
    assert ck.tokenizer_dir == qwen3_pair.out / "tokenizer" and (ck.tokenizer_dir / "tokenizer.json").is_file()
    meta = json.loads((qwen3_pair.out / "ddtree.json").read_text())
    assert meta["format"] == 2 and meta["dtype"] == "float32" and meta["drafter"]["source"] == str(qwen3_pair.hf_draft)
    draft_cfg = json.loads((qwen3_pair.out / "draft" / "config.json").read_text())
    assert draft_cfg["dflash_config"]["target_layer_ids"] == [1, 2]


def test_llama_tied(llama_target):
    ck = load_checkpoint(llama_target.out)
    assert ck.target_cfg.tie_embeddings and ck.target_cfg.rope.kind == "llama3"
    assert_params_equal(ck.target_params, expected_params(llama_target.hf_target, tied=True))
    assert "lm_head" not in ck.target_params and "q_norm" not in ck.target_params["layers"][0]
    assert ck.drafter_cfg is None and ck.drafter_params is None and ck.tokenizer_dir is None
    assert json.loads((llama_target.out / "ddtree.json").read_text())["tokenizer"] is None


def test_qwen2_sharded(qwen2_sharded):
    assert len(list(qwen2_sharded.hf_target.glob("*.safetensors"))) >= 3
    ck = load_checkpoint(qwen2_sharded.out)
    assert_params_equal(ck.target_params, expected_params(qwen2_sharded.hf_target))
    assert {"q_bias", "k_bias", "v_bias"} <= set(ck.target_params["layers"][0])
    assert "o_bias" not in ck.target_params["layers"][0]


def test_bfloat16_conversion(qwen3_pair, tmp_path):
    out = tmp_path / "bf16"
    convert_cli("--target", qwen3_pair.hf_target, "--draft", qwen3_pair.hf_draft, "--out", out, "--dtype", "bfloat16")
    ck = load_checkpoint(out)
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert json.loads((out / "ddtree.json").read_text())["dtype"] == "bfloat16"
    assert_params_equal(ck.target_params, expected_params(qwen3_pair.hf_target), dtype=bf16)
    assert_params_equal(ck.drafter_params, expected_params(qwen3_pair.hf_draft), dtype=bf16)
    # and a cast on load
    up = load_checkpoint(out, dtype="float32", with_drafter=False)
    assert up.drafter_params is None and up.target_params["embed"].dtype == np.float32


def test_bfloat16_source_and_prefixed_drafter(tmp_path):
    """A bf16 checkpoint converts at its own dtype by default; drafter names may carry "model."."""
    target = make_target(tmp_path / "t", "qwen3", layers=2, dtype="bfloat16")
    draft = make_drafter(tmp_path / "d", target, layers=1, target_layer_ids=[0, 1], name_prefix="model.",
                         layer_types=["sliding_attention"], sliding_window=12)
    convert_cli("--target", target, "--draft", draft, "--out", tmp_path / "out")
    ck = load_checkpoint(tmp_path / "out")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert_params_equal(ck.target_params, expected_params(target), dtype=bf16)
    assert_params_equal(ck.drafter_params, expected_params(draft), dtype=bf16)
    assert ck.drafter_cfg.sliding_windows == (12,)


def test_force_replaces_existing_output(llama_target, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    convert_cli("--target", llama_target.hf_target, "--out", out, "--dtype", "float32", "--force")
    assert not (out / "old.txt").exists() and (out / "ddtree.json").is_file()
    assert list(tmp_path.iterdir()) == [out]


def test_name_table_tied_checkpoint_may_hold_lm_head(llama_target):
    from ddtree_jax.checkpoint import names
    from ddtree_jax.models.config import TargetConfig, read_hf_config

    cfg = TargetConfig.from_hf(read_hf_config(llama_target.hf_target))
    entries = names.target_entries(cfg)
    found = {e.hf_name: e.hf_shape for e in entries}
    names.match(entries, {**found, "lm_head.weight": (384, 64)}, where="x", tied=True)
    with pytest.raises(UserError, match="unexpected tensor 'lm_head.weight'"):
        names.match(entries, {**found, "lm_head.weight": (384, 64)}, where="x", tied=False)


# ---------------------------------------------------------------------------------------------
# Checkpoint API


def test_save_checkpoint_roundtrip_and_fresh_process(qwen3_pair, tmp_path):
    ck = load_checkpoint(qwen3_pair.out)
    raw_t = json.loads((qwen3_pair.out / "target" / "config.json").read_text())
    raw_d = json.loads((qwen3_pair.out / "draft" / "config.json").read_text())
    out = tmp_path / "saved"
    save_checkpoint(out, raw_t, ck.target_params, raw_d, ck.drafter_params, ck.tokenizer_dir,
                    meta={"training": {"steps": 3}})
    with pytest.raises(UserError, match="already exists"):
        save_checkpoint(out, raw_t, ck.target_params, None, None, None)
    bad = dict(ck.drafter_params, fc=ck.drafter_params["fc"][:, :3])
    with pytest.raises(UserError, match=r"param 'fc' has shape \[128, 3\], expected \[128, 64\]"):
        save_checkpoint(tmp_path / "bad", raw_t, ck.target_params, raw_d, bad, None)
    assert not (tmp_path / "bad").exists()
    assert json.loads((out / "ddtree.json").read_text())["training"] == {"steps": 3}
    # A fresh process restores it on CPU without any device or sharding information.
    code = ("import sys; from ddtree_jax.checkpoint import load_checkpoint; ck = load_checkpoint(sys.argv[1]); "
            "p = ck.drafter_params; print(type(p['layers']).__name__, len(p['layers']), p['fc'].shape, "
            "type(p['fc']).__module__)")
    r = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, cwd=ROOT,
                       env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["list", "2", "(128,", "64)", "numpy"]
    # the params file is plain safetensors: the reference reader reads every tensor by its dotted name
    from safetensors.numpy import load_file

    flat = load_file(out / "target" / "params.safetensors")
    assert sorted(flat) == sorted(flatten(ck.target_params))
    for k, v in flatten(ck.target_params).items():
        np.testing.assert_array_equal(flat[k], v)


def test_format_1_orbax_checkpoint_still_loads(qwen3_pair, tmp_path):
    """A checkpoint converted before params were safetensors (orbax params directories, format 1)
    loads as before, and generates what the new format does."""
    import orbax.checkpoint as ocp

    from ddtree_jax.generator import Generator

    old = Path(shutil.copytree(qwen3_pair.out, tmp_path / "old"))
    new = load_checkpoint(qwen3_pair.out)
    for model, params in (("target", new.target_params), ("draft", new.drafter_params)):
        (old / model / "params.safetensors").unlink()
        ocp.PyTreeCheckpointer().save(old / model / "params", params)
    meta = json.loads((old / "ddtree.json").read_text())
    (old / "ddtree.json").write_text(json.dumps(dict(meta, format=1)))
    ck = load_checkpoint(old)
    for got, want in ((ck.target_params, new.target_params), (ck.drafter_params, new.drafter_params)):
        a, b = flatten(got), flatten(want)
        assert sorted(a) == sorted(b)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    prompt = [[5, 9, 33, 2, 17]]
    [a] = Generator(ck, method="ddtree", budget=8).generate_ids(prompt, max_new_tokens=12)
    [b] = Generator(load_checkpoint(qwen3_pair.out, lazy=True), method="ddtree", budget=8).generate_ids(
        prompt, max_new_tokens=12)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 12


def test_load_checkpoint_errors(qwen3_pair, tmp_path):
    with pytest.raises(UserError, match="not found; run python -m convert"):
        load_checkpoint(tmp_path / "nope")
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(qwen3_pair.hf_target / "config.json", bare / "config.json")
    with pytest.raises(UserError, match="config.json but no model.safetensors.* run python -m convert"):
        load_checkpoint(bare)
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "ddtree.json").write_text('{"format": 99}')
    with pytest.raises(UserError, match="format 99"):
        load_checkpoint(fake)


def test_hf_directories_load_straight(qwen3_pair, qwen2_sharded):
    """A Hugging Face directory loads without a converted copy, through the same name table: the
    params are the converted ones, bit for bit (lazy or not), its tokenizer is its own."""
    from ddtree_jax.checkpoint import load_hf

    ck = load_hf(qwen3_pair.hf_target, qwen3_pair.hf_draft, dtype="float32")
    conv = load_checkpoint(qwen3_pair.out)
    assert_params_equal(ck.target_params, flatten(conv.target_params))
    assert_params_equal(ck.drafter_params, flatten(conv.drafter_params))
    assert ck.tokenizer_dir == qwen3_pair.hf_target and ck.drafter_cfg == conv.drafter_cfg
    lazy = load_checkpoint(qwen2_sharded.hf_target, dtype="float32", lazy=True)
    assert lazy.drafter_params is None and lazy.target_params["embed"].shape == (384, 64)
    got, want = flatten(lazy.target_params), flatten(load_checkpoint(qwen2_sharded.out).target_params)
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=k)


def test_truncated_after_scan_is_one_line(llama_copy):
    """A shard cut short after its header was read (a copy still in progress): a one-line error
    when the tensor is read, not a crash from a memory-mapped page past the end."""
    from ddtree_jax.checkpoint.hf import HFModel

    model = HFModel(llama_copy, "--target", "target").scan()
    f = llama_copy / "model.safetensors"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    with pytest.raises(UserError, match="is cut short; truncated"):
        for leaf in model.lazy_params()["layers"][-1].values():
            leaf.load()


# ---------------------------------------------------------------------------------------------
# The CLI's error contract: exit 2, one line on stderr naming the problem, no traceback, nothing written.


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", **extra)
    return env


def run_cli(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "convert", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=_env(**env), timeout=120)


def nothing_written(out: Path) -> bool:
    return not out.exists() and not list(out.parent.glob(out.name + ".*"))


def assert_fails(r: subprocess.CompletedProcess, *needles: str) -> None:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in err and "\n" not in err, err
    assert err.startswith("convert: error: "), err
    for n in needles:
        assert n in err, err


@pytest.fixture()
def llama_copy(llama_target, tmp_path) -> Path:
    """A writable copy of the single-file llama checkpoint, to break."""
    return Path(shutil.copytree(llama_target.hf_target, tmp_path / "hf"))


def _rewrite(model_dir: Path, edit) -> None:
    from safetensors.numpy import load_file, save_file

    f = model_dir / "model.safetensors"
    tensors = load_file(f)
    edit(tensors)
    save_file(tensors, f)


def test_missing_target_dir(tmp_path):
    r = run_cli("--target", tmp_path / "nope", "--out", tmp_path / "out")
    assert_fails(r, "--target directory", "nope", "not found")
    assert nothing_written(tmp_path / "out")


def test_missing_safetensors(llama_copy, tmp_path):
    (llama_copy / "model.safetensors").unlink()
    r = run_cli("--target", llama_copy, "--out", tmp_path / "out")
    assert_fails(r, "has no model.safetensors or model.safetensors.index.json")
    assert nothing_written(tmp_path / "out")


def test_missing_shard(qwen2_sharded, tmp_path):
    hf = Path(shutil.copytree(qwen2_sharded.hf_target, tmp_path / "hf"))
    sorted(hf.glob("model-*.safetensors"))[1].unlink()
    r = run_cli("--target", hf, "--out", tmp_path / "out")
    assert_fails(r, "model.safetensors.index.json lists model-00002-of-", "missing")
    assert nothing_written(tmp_path / "out")


def test_truncated_shard(qwen2_sharded, tmp_path):
    hf = Path(shutil.copytree(qwen2_sharded.hf_target, tmp_path / "hf"))
    shard = sorted(hf.glob("model-*.safetensors"))[-1]
    shard.write_bytes(shard.read_bytes()[:-100])
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an existing checkpoint")
    r = run_cli("--target", hf, "--out", out, "--force")
    assert_fails(r, f"{shard} is not a valid safetensors file", "truncated")
    assert [c.name for c in out.iterdir()] == ["keep.txt"] and sorted(c.name for c in tmp_path.iterdir()) == ["hf", "out"]


def test_disk_full_mid_write(qwen3_pair, tmp_path, monkeypatch, capsys):
    """The disk fills after a few tensors (ENOSPC from the write): one line, exit 2, the partial
    output removed, an existing checkpoint untouched."""
    import errno

    from convert import main
    from ddtree_jax.checkpoint import tensors

    real, calls = tensors.StreamWriter.write, []

    def write(self, name, array):
        calls.append(name)
        if len(calls) > 5:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, name, array)

    monkeypatch.setattr(tensors.StreamWriter, "write", write)
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an existing checkpoint")
    rc = main(["--target", str(qwen3_pair.hf_target), "--draft", str(qwen3_pair.hf_draft), "--out", str(out),
               "--force"])
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar's line
    assert rc == 2 and len(calls) == 6
    assert err == f"convert: error: conversion failed: No space left on device; nothing was written to {out}", err
    assert [c.name for c in out.iterdir()] == ["keep.txt"] and [c.name for c in tmp_path.iterdir()] == ["out"]


def test_sync_error(qwen3_pair, tmp_path, monkeypatch, capsys):
    """A write error the disk reports only at a sync (EIO, background or final) fails the
    conversion as a write error would: one line, exit 2, nothing left."""
    import errno

    from convert import main
    from ddtree_jax.checkpoint import tensors

    def fail(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tensors, "SYNC_BYTES", 1)  # a sync after every tensor
    monkeypatch.setattr(tensors.os, "fdatasync", fail)
    monkeypatch.setattr(tensors.os, "fsync", fail)
    out = tmp_path / "out"
    rc = main(["--target", str(qwen3_pair.hf_target), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2
    assert err == f"convert: error: conversion failed: Input/output error; nothing was written to {out}", err
    assert [c.name for c in tmp_path.iterdir()] == []


def test_background_sync_error_is_raised_by_the_next_write(tmp_path, monkeypatch):
    """An error of the background sync comes out of the writer's next call."""
    import errno
    import threading

    from ddtree_jax.checkpoint import tensors

    failed = threading.Event()

    def fdatasync(fd):
        failed.set()
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(tensors, "SYNC_BYTES", 1)
    monkeypatch.setattr(tensors.os, "fdatasync", fdatasync)
    specs = [(f"t{i}", (8, 8), np.float32) for i in range(3)]
    with pytest.raises(OSError, match="Input/output error"):
        with tensors.StreamWriter(tmp_path / "p.safetensors", specs) as w:
            w.write("t0", np.zeros((8, 8), np.float32))
            assert failed.wait(30), "no sync was run"
            w._syncer._thread.join(30)  # the error is stored once the thread ends
            w.write("t1", np.zeros((8, 8), np.float32))
    assert w._next == 1


def test_stream_writer_syncs_while_writing(tmp_path, monkeypatch):
    """A sync is asked for once SYNC_BYTES are written and runs while tensors are still to come
    (not only at close), and the file reads back."""
    import threading

    from ddtree_jax.checkpoint import tensors

    real, during, synced = tensors.os.fdatasync, [], threading.Event()

    def fdatasync(fd):
        during.append(w._next)
        real(fd)
        synced.set()

    specs = [(f"t{i}", (64, 64), np.float32) for i in range(8)]
    monkeypatch.setattr(tensors, "SYNC_BYTES", 64 * 64 * 4 * 2)
    monkeypatch.setattr(tensors.os, "fdatasync", fdatasync)
    with tensors.StreamWriter(tmp_path / "p.safetensors", specs) as w:
        for i, (name, shape, dt) in enumerate(specs):
            w.write(name, np.full(shape, i, dt))
            if i == 1:  # the second tensor reaches SYNC_BYTES: its sync comes before the third
                assert synced.wait(30), "no sync was run"
    assert during and min(during) < len(specs)
    back = tensors.read_header(tmp_path / "p.safetensors")
    assert [float(back[f"t{i}"].load()[0, 0]) for i in range(8)] == list(range(8))


def test_unsupported_architecture(llama_copy, tmp_path):
    cfg = json.loads((llama_copy / "config.json").read_text())
    cfg.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")
    (llama_copy / "config.json").write_text(json.dumps(cfg))
    r = run_cli("--target", llama_copy, "--out", tmp_path / "out")
    assert_fails(r, "'GPT2LMHeadModel' is not supported", "Qwen3ForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM")
    assert nothing_written(tmp_path / "out")


def test_wrong_shape_tensor(llama_copy, tmp_path):
    _rewrite(llama_copy, lambda t: t.update({"model.layers.2.self_attn.k_proj.weight": np.zeros((64, 64), np.float32)}))
    r = run_cli("--target", llama_copy, "--out", tmp_path / "out")
    assert_fails(r, "'model.layers.2.self_attn.k_proj.weight' has shape [64, 64], expected [32, 64]")
    assert nothing_written(tmp_path / "out")


def test_missing_tensor(llama_copy, tmp_path):
    _rewrite(llama_copy, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    r = run_cli("--target", llama_copy, "--out", tmp_path / "out")
    assert_fails(r, "'model.layers.1.mlp.up_proj.weight' is missing (expected shape [128, 64])")
    assert nothing_written(tmp_path / "out")


def test_unexpected_tensor(llama_copy, tmp_path):
    _rewrite(llama_copy, lambda t: t.update({"model.layers.0.mlp.gate_proj.bias": np.zeros(128, np.float32),
                                             "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(8, np.float32)}))
    r = run_cli("--target", llama_copy, "--out", tmp_path / "out")
    assert_fails(r, "unexpected tensor 'model.layers.0.mlp.gate_proj.bias' (shape [128])")
    assert nothing_written(tmp_path / "out")


def test_unknown_dtype(llama_target, tmp_path):
    r = run_cli("--target", llama_target.hf_target, "--out", tmp_path / "out", "--dtype", "int4")
    assert_fails(r, "unknown dtype 'int4'; valid: bfloat16, float32, float16")
    assert nothing_written(tmp_path / "out")


def test_output_exists_without_force(llama_target, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    r = run_cli("--target", llama_target.hf_target, "--out", out)
    assert_fails(r, "already exists; pass --force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and list(tmp_path.iterdir()) == [out]


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(llama_copy, tmp_path, damage):
    f = llama_copy / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(b"\xff" * 64 if damage == "garbage" else data[: len(data) // 2])
    r = run_cli("--target", llama_copy, "--out", tmp_path / "out")
    assert_fails(r, f"{f} is not a valid safetensors file")
    assert nothing_written(tmp_path / "out")


@pytest.mark.parametrize("misfit, needle", [
    (dict(hidden=32), "hidden size 32 != target's 64"),
    (dict(vocab=500, mask_token_id=5), "vocab size 500 != target's 384"),
    (dict(target_layer_ids=[1, 7]), "tapped layers [7] are outside the target's 0..3"),
    (dict(mask_token_id=10_000), "mask token id 10000 is outside the vocabulary"),
])
def test_drafter_that_does_not_fit(qwen3_pair, tmp_path, misfit, needle):
    draft = make_drafter(tmp_path / "d", qwen3_pair.hf_target, **misfit)
    r = run_cli("--target", qwen3_pair.hf_target, "--draft", draft, "--out", tmp_path / "out")
    assert_fails(r, "the drafter does not fit the target", needle)
    assert nothing_written(tmp_path / "out")


def test_debug_shows_traceback(tmp_path):
    r = run_cli("--target", tmp_path / "nope", "--out", tmp_path / "out", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "UserError" in r.stderr


def _default_sigint():
    """In the child: Ctrl-C's default action. A suite started as a background job (`.ci/run &`)
    inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# `python -m convert` with 0.2 s after each tensor it writes, so that a signal lands midway
SLOW_CONVERT = ("import time, convert\n"
                "from ddtree_jax.checkpoint.tensors import StreamWriter as W\n"
                "real = W.write\n"
                "W.write = lambda *a: (real(*a), time.sleep(0.2))[0]\n"
                "raise SystemExit(convert.main())\n")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_leaves_nothing(qwen3_pair, tmp_path, sig):
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-c", SLOW_CONVERT, "--target", str(qwen3_pair.hf_target), "--draft",
                          str(qwen3_pair.hf_draft), "--out", str(out)], cwd=ROOT,
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, preexec_fn=_default_sigint)
    tmp = out.with_name(f"out.tmp-{p.pid}")
    deadline = time.monotonic() + 60
    while not tmp.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tmp.exists(), "the conversion never started"
    time.sleep(0.5)  # midway through the tensors
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err.strip().splitlines()[-1] and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def _digest(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["target", "inside target", "above target", "draft"])
def test_output_over_a_source_is_refused_even_with_force(qwen3_pair, tmp_path, where):
    """--out equal to, inside or above a source directory would replace the Hugging Face model
    with the conversion: refused with or without --force, the source untouched."""
    src = Path(shutil.copytree(qwen3_pair.hf_target, tmp_path / "models" / "target"))
    draft = Path(shutil.copytree(qwen3_pair.hf_draft, tmp_path / "models" / "draft"))
    before = _digest(tmp_path / "models")
    out = {"target": src, "inside target": src / "converted", "above target": tmp_path / "models",
           "draft": draft}[where]
    for force in ((), ("--force",)):
        r = run_cli("--target", src, "--draft", draft, "--out", out, *force)
        assert_fails(r, "--out", "directory of its own")
    assert _digest(tmp_path / "models") == before
    assert not (src / "converted").exists()


def test_interrupt_while_saving_leaves_nothing(tmp_path):
    """Ctrl-C while the params file is being written: no temporary directory is left, an
    existing output is untouched. A model whose write takes a while: 256 MB of untied float32
    embeddings."""
    import numpy as np
    from safetensors.numpy import save_file

    small = make_target(tmp_path / "small", "qwen3", layers=1)
    cfg = json.loads((small / "config.json").read_text())
    cfg.update(vocab_size=131072, hidden_size=256, tie_word_embeddings=False)
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text(json.dumps(cfg))
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    qd, kd, inter = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,),
              "model.layers.0.input_layernorm.weight": (h,), "model.layers.0.post_attention_layernorm.weight": (h,),
              "model.layers.0.self_attn.q_proj.weight": (qd, h), "model.layers.0.self_attn.k_proj.weight": (kd, h),
              "model.layers.0.self_attn.v_proj.weight": (kd, h), "model.layers.0.self_attn.o_proj.weight": (h, qd),
              "model.layers.0.self_attn.q_norm.weight": (cfg["head_dim"],),
              "model.layers.0.self_attn.k_norm.weight": (cfg["head_dim"],),
              "model.layers.0.mlp.gate_proj.weight": (inter, h), "model.layers.0.mlp.up_proj.weight": (inter, h),
              "model.layers.0.mlp.down_proj.weight": (h, inter)}
    rng = np.random.default_rng(0)
    save_file({k: rng.standard_normal(s, dtype=np.float32) for k, s in shapes.items()}, str(big / "model.safetensors"))
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("an existing checkpoint")
    p = subprocess.Popen([sys.executable, "-m", "convert", "--target", str(big), "--out", str(out), "--force",
                          "--dtype", "float32"], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    tmp = out.with_name(f"out.tmp-{p.pid}")
    deadline = time.monotonic() + 120
    while p.poll() is None and time.monotonic() < deadline and not any(
            "params" in c.name for c in (tmp / "target").glob("*")):  # the write has begun
        time.sleep(0.01)
    assert p.poll() is None, "the save ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    assert "interrupted" in err.strip().splitlines()[-1] and "Traceback" not in err
    time.sleep(1.0)  # any writer thread still running would recreate files here
    assert sorted(c.name for c in tmp_path.iterdir()) == ["big", "out", "small"]
    assert [c.name for c in out.iterdir()] == ["keep.txt"]
