"""Mixture-of-experts targets (Qwen3-MoE, Qwen2-MoE with a shared expert) through the converter and
the loaders: every param equals its HF tensor in our layout, whichever way the checkpoint holds its
experts (one tensor per expert, as on the hub, or transformers 5's fused 3-D tensors), sharded or
not; bad checkpoints are one line and exit 2 with nothing written; the experts stream.
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import convert_cli
from hf_fixtures import make_drafter, make_target

from ddtree_jax.checkpoint import load_checkpoint, load_hf
from ddtree_jax.models.config import TargetConfig, read_hf_config

E, TOP_K, IE, IS = 8, 2, 32, 48  # experts, chosen a token, expert width, shared expert width
SPEC = {  # family -> make_target options
    "qwen3_moe": dict(layers=3, mlp_only_layers=[1], norm_topk_prob=True),
    "qwen2_moe": dict(layers=2, shared_intermediate=IS),
}

# ---------------------------------------------------------------------------------------------
# Our layout, written out independently of ddtree_jax/checkpoint/names.py: HF name -> (key, transpose).

_LAYER = {
    "input_layernorm.weight": ("attn_norm", False), "post_attention_layernorm.weight": ("mlp_norm", False),
    "self_attn.q_proj.weight": ("q", True), "self_attn.k_proj.weight": ("k", True),
    "self_attn.v_proj.weight": ("v", True), "self_attn.o_proj.weight": ("o", True),
    "self_attn.q_proj.bias": ("q_bias", False), "self_attn.k_proj.bias": ("k_bias", False),
    "self_attn.v_proj.bias": ("v_bias", False),
    "self_attn.q_norm.weight": ("q_norm", False), "self_attn.k_norm.weight": ("k_norm", False),
    "mlp.gate_proj.weight": ("gate", True), "mlp.up_proj.weight": ("up", True), "mlp.down_proj.weight": ("down", True),
    "mlp.gate.weight": ("router", True),
    "mlp.shared_expert.gate_proj.weight": ("shared_gate", True),
    "mlp.shared_expert.up_proj.weight": ("shared_up", True),
    "mlp.shared_expert.down_proj.weight": ("shared_down", True),
    "mlp.shared_expert_gate.weight": ("shared_expert_gate", True),
}
_TOP = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}


def hf_tensors(model_dir: Path) -> dict[str, np.ndarray]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        out.update({k: v.float().numpy() for k, v in load_file(f).items()})
    return out


def expected_params(model_dir: Path) -> dict[str, np.ndarray]:
    """Dotted key -> array in our layout, from the HF tensors: per-expert ones stacked, fused ones split."""
    out, experts = {}, {}
    for name, t in hf_tensors(model_dir).items():
        if name in _TOP:
            out[_TOP[name]] = t.T if name == "lm_head.weight" else t
            continue
        i, rest = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name).groups()
        if m := re.fullmatch(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", rest):
            experts.setdefault((i, m[2]), {})[int(m[1])] = t.T
        elif rest == "mlp.experts.gate_up_proj":  # [E, 2*Ie, H]: gate rows, then up rows
            half = t.shape[1] // 2
            out[f"layers.{i}.experts_gate"] = t[:, :half].transpose(0, 2, 1)
            out[f"layers.{i}.experts_up"] = t[:, half:].transpose(0, 2, 1)
        elif rest == "mlp.experts.down_proj":  # [E, H, Ie]
            out[f"layers.{i}.experts_down"] = t.transpose(0, 2, 1)
        else:
            key, transpose = _LAYER[rest]
            out[f"layers.{i}.{key}"] = t.T if transpose else t
    for (i, proj), by_e in experts.items():
        assert sorted(by_e) == list(range(E)), (i, proj, sorted(by_e))
        out[f"layers.{i}.experts_{proj}"] = np.stack([by_e[e] for e in range(E)])
    return out


def flatten(params) -> dict[str, np.ndarray]:
    out = {}
    for k, v in params.items():
        if k == "layers":
            for i, layer in enumerate(v):
                out.update({f"layers.{i}.{n}": a for n, a in layer.items()})
        else:
            out[k] = v
    return out


def assert_params_equal(params, expected: dict[str, np.ndarray]) -> None:
    got = flatten(params)
    assert sorted(got) == sorted(expected)
    for k, want in expected.items():
        a = np.asarray(got[k])
        assert a.dtype == np.float32 and a.shape == want.shape, (k, a.dtype, a.shape, want.shape)
        np.testing.assert_array_equal(a, want, err_msg=k)


# ---------------------------------------------------------------------------------------------
# Fixtures: each family in both expert layouts, sharded, and converted


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(family, layout) -> (HF dir, drafter dir or None, converted dir); layouts "per_expert", "fused"."""
    root = tmp_path_factory.mktemp("moe")
    out = {}
    for family, spec in SPEC.items():
        for layout in ("per_expert", "fused"):
            d = root / f"{family}_{layout}"
            target = make_target(d / "hf", family, sharded=True, experts=E, top_k=TOP_K, expert_intermediate=IE,
                                 expert_layout=layout, **spec)
            draft = None
            if family == "qwen3_moe":
                draft = make_drafter(d / "draft", target, layers=1, target_layer_ids=[0, 2])
            convert_cli("--target", target, *(["--draft", draft] if draft else []), "--out", d / "out",
                        "--dtype", "float32")
            out[family, layout] = (target, draft, d / "out")
    return out


CASES = [(f, lay) for f in SPEC for lay in ("per_expert", "fused")]


@pytest.mark.parametrize("family, layout", CASES)
def test_convert_round_trip(moe, family, layout):
    target, draft, out = moe[family, layout]
    names = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
    assert fused == (layout == "fused") and len(list(target.glob("*.safetensors"))) >= 3
    ck = load_checkpoint(out)
    cfg = ck.target_cfg
    assert cfg == TargetConfig.from_hf(read_hf_config(target))  # the stored HF config rebuilds the MoE config
    assert cfg.family == family and cfg.moe.num_experts == E and cfg.moe.top_k == TOP_K
    assert cfg.moe.expert_intermediate == IE
    if family == "qwen3_moe":
        assert cfg.moe.sparse_layers == (True, False, True) and cfg.moe.norm_topk_prob
        assert cfg.moe.shared_intermediate == 0 and "gate" in ck.target_params["layers"][1]
        assert ck.drafter_cfg is not None and ck.drafter_params["fc"].shape == (128, 64)
    else:
        assert cfg.moe.sparse_layers == (True, True) and cfg.moe.shared_intermediate == IS
    layer = ck.target_params["layers"][0]
    assert layer["router"].shape == (64, E) and layer["experts_gate"].shape == (E, 64, IE)
    assert layer["experts_up"].shape == (E, 64, IE) and layer["experts_down"].shape == (E, IE, 64)
    assert "gate" not in layer and "up" not in layer and "down" not in layer
    if family == "qwen2_moe":
        assert layer["shared_gate"].shape == (64, IS) and layer["shared_down"].shape == (IS, 64)
        assert layer["shared_expert_gate"].shape == (64, 1)
    assert_params_equal(ck.target_params, expected_params(target))
    # the lazy load hands every key of every layer through, the same arrays once read
    lazy = load_checkpoint(out, lazy=True)
    assert_params_equal(lazy.target_params, flatten(ck.target_params))


@pytest.mark.parametrize("family, layout", CASES)
def test_load_hf_equals_converted(moe, family, layout):
    target, draft, out = moe[family, layout]
    conv = load_checkpoint(out)
    for lazy in (False, True):
        ck = load_hf(target, draft, dtype="float32", lazy=lazy)
        assert ck.target_cfg == conv.target_cfg
        assert_params_equal(ck.target_params, flatten(conv.target_params))
        if draft is not None:
            assert_params_equal(ck.drafter_params, flatten(conv.drafter_params))


def test_both_layouts_give_the_same_params_and_fused_is_transformers_memory(moe):
    """The fused layout is what transformers holds in memory (gate rows before up rows): our
    experts equal the model's own gate_up_proj / down_proj, and the per-expert file converts the same."""
    import torch
    import transformers

    target, _, out = moe["qwen2_moe", "per_expert"]
    per, fused = load_checkpoint(out), load_checkpoint(moe["qwen2_moe", "fused"][2])
    assert_params_equal(fused.target_params, flatten(per.target_params))
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    for i, layer in enumerate(per.target_params["layers"]):
        experts = model.model.layers[i].mlp.experts
        gate_up = experts.gate_up_proj.detach().numpy()
        np.testing.assert_array_equal(layer["experts_gate"], gate_up[:, :IE].transpose(0, 2, 1))
        np.testing.assert_array_equal(layer["experts_up"], gate_up[:, IE:].transpose(0, 2, 1))
        np.testing.assert_array_equal(layer["experts_down"], experts.down_proj.detach().numpy().transpose(0, 2, 1))


def test_bfloat16_conversion_stacks_cast_experts(moe, tmp_path):
    import ml_dtypes

    target, _, _ = moe["qwen3_moe", "fused"]
    convert_cli("--target", target, "--out", tmp_path / "bf16", "--dtype", "bfloat16")
    ck = load_checkpoint(tmp_path / "bf16")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for k, want in expected_params(target).items():
        got = flatten(ck.target_params)[k]
        assert got.dtype == bf16, k
        np.testing.assert_array_equal(got, want.astype(bf16), err_msg=k)


def test_export_writes_the_hub_layout(moe, tmp_path):
    """A converted MoE checkpoint exported back to HF form holds one tensor per expert and converts
    to the same params."""
    from ddtree_jax.train.export import export_checkpoint

    _, _, out = moe["qwen2_moe", "fused"]
    hf_dir, _ = export_checkpoint(out, tmp_path / "hf", dtype="float32")
    names = set(hf_tensors(hf_dir))
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert not any("gate_up_proj" in n for n in names)
    convert_cli("--target", hf_dir, "--out", tmp_path / "again", "--dtype", "float32")
    assert_params_equal(load_checkpoint(tmp_path / "again").target_params,
                        flatten(load_checkpoint(out).target_params))


# ---------------------------------------------------------------------------------------------
# Streaming: one expert param at a time, read one expert's block at a time


def test_convert_holds_one_stacked_expert_param(moe, tmp_path, monkeypatch):
    """The converter never holds two stacked expert arrays at once (each is written and released
    before the next is built), and reads a fused tensor one expert's block at a time."""
    import weakref

    from ddtree_jax.checkpoint import tensors

    live: list[weakref.ref] = []
    most = [0]
    reads: list[tuple[str, int | None, tuple[int, ...]]] = []
    real_load, real_read = tensors.StackedTensor.load, tensors.TensorInfo.read_block

    def load(self):
        most[0] = max(most[0], sum(r() is not None for r in live) + 1)
        a = real_load(self)
        live.append(weakref.ref(a))
        return a

    def read_block(self, index=None, rows=None):
        a = real_read(self, index, rows)
        reads.append((self.name, index, a.shape))
        return a

    monkeypatch.setattr(tensors.StackedTensor, "load", load)
    monkeypatch.setattr(tensors.TensorInfo, "read_block", read_block)
    target, _, _ = moe["qwen3_moe", "fused"]
    convert_cli("--target", target, "--out", tmp_path / "out", "--dtype", "float32")
    assert len(live) == 2 * 3 and most[0] == 1  # 2 MoE layers x gate/up/down, one alive at a time
    expert_reads = [(n, i, s) for n, i, s in reads if ".experts." in n]
    assert expert_reads and all(i is not None and s in ((IE, 64), (64, IE)) for _, i, s in expert_reads)


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """Single-file qwen3_moe checkpoints, per expert and fused, to copy and break."""
    root = tmp_path_factory.mktemp("moe_small")
    return {layout: make_target(root / layout, "qwen3_moe", layers=2, experts=E, top_k=TOP_K,
                                expert_intermediate=IE, expert_layout=layout)
            for layout in ("per_expert", "fused")}


def _convert_fails(capsys, tmp_path, *args) -> str:
    from convert import main

    out = tmp_path / "out"
    rc = main([*map(str, args), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "\n" not in err and "Traceback" not in err and err.startswith("convert: error: "), err
    assert not out.exists() and not list(tmp_path.glob("out.*")), list(tmp_path.iterdir())
    return err


def _broken(src: Path, tmp_path: Path, edit) -> Path:
    from safetensors.numpy import load_file, save_file

    d = Path(shutil.copytree(src, tmp_path / "hf"))
    t = load_file(d / "model.safetensors")
    edit(t)
    save_file(t, d / "model.safetensors")
    return d


@pytest.mark.parametrize("layout, edit, needle", [
    ("per_expert", lambda t: t.pop("model.layers.1.mlp.experts.5.up_proj.weight"),
     "tensor 'model.layers.1.mlp.experts.5.up_proj.weight' is missing (expected shape [32, 64])"),
    ("fused", lambda t: t.pop("model.layers.0.mlp.experts.down_proj"),
     "tensor 'model.layers.0.mlp.experts.down_proj' is missing (expected shape [8, 64, 32])"),
    ("per_expert",
     lambda t: t.update({"model.layers.0.mlp.experts.3.gate_proj.weight": np.zeros((33, 64), np.float32)}),
     "tensor 'model.layers.0.mlp.experts.3.gate_proj.weight' has shape [33, 64], expected [32, 64]"),
    ("fused", lambda t: t.update({"model.layers.1.mlp.experts.gate_up_proj": np.zeros((8, 60, 64), np.float32)}),
     "tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape [8, 60, 64], expected [8, 64, 64]"),
    ("fused", lambda t: t.update({"model.layers.1.mlp.experts.gate_up_proj": np.zeros((7, 64, 64), np.float32)}),
     "tensor 'model.layers.1.mlp.experts.gate_up_proj' has shape [7, 64, 64], expected [8, 64, 64]"),
    ("per_expert", lambda t: t.update({"model.layers.1.mlp.gate.weight": np.zeros((6, 64), np.float32)}),
     "tensor 'model.layers.1.mlp.gate.weight' has shape [6, 64], expected [8, 64]"),
    ("per_expert", lambda t: t.update({"model.layers.0.mlp.experts.8.up_proj.weight": np.zeros((32, 64), np.float32)}),
     "unexpected tensor 'model.layers.0.mlp.experts.8.up_proj.weight' (shape [32, 64])"),
    # a layer holding both layouts is read as fused; its per-expert tensors are the odd ones out
    ("fused", lambda t: t.update({"model.layers.0.mlp.experts.0.up_proj.weight": np.zeros((32, 64), np.float32)}),
     "unexpected tensor 'model.layers.0.mlp.experts.0.up_proj.weight'"),
], ids=["missing-expert", "missing-fused", "misshapen-expert", "misshapen-fused", "fused-too-few-experts",
        "router-size", "extra-expert", "mixed-layouts"])
def test_bad_expert_tensors(small, tmp_path, capsys, layout, edit, needle):
    hf = _broken(small[layout], tmp_path, edit)
    err = _convert_fails(capsys, tmp_path, "--target", hf)
    assert needle in err, err


def test_top_k_over_experts(small, tmp_path, capsys):
    hf = Path(shutil.copytree(small["per_expert"], tmp_path / "hf"))
    cfg = json.loads((hf / "config.json").read_text())
    (hf / "config.json").write_text(json.dumps(dict(cfg, num_experts_per_tok=E + 1)))
    err = _convert_fails(capsys, tmp_path, "--target", hf)
    assert f"num_experts_per_tok is {E + 1}; it must be at most num_experts ({E})" in err, err


@pytest.mark.parametrize("misfit, needle", [
    (dict(hidden=32), "hidden size 32 != target's 64"),
    (dict(vocab=500, mask_token_id=5), "vocab size 500 != target's 384"),
])
def test_drafter_for_another_model(small, tmp_path, capsys, misfit, needle):
    draft = make_drafter(tmp_path / "d", small["fused"], layers=1, target_layer_ids=[0, 1], **misfit)
    err = _convert_fails(capsys, tmp_path, "--target", small["fused"], "--draft", draft)
    assert "the drafter does not fit the target" in err and needle in err, err
