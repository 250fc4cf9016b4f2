"""Hybrid Qwen3.5 targets end to end: a tiny random transformers Qwen3_5ForCausalLM (and the same
text model as a Qwen3_5ForConditionalGeneration checkpoint, vision and MTP tensors beside it)
through python -m convert and the loaders, then every method of the engine against transformers'
greedy decoding in float32 (batches of prompts of different lengths, a chunked prefill, a stop
token, deep acceptance through a noisy oracle), `--budget auto`'s samples against the target's
distribution, and bad input (one line, exit 2). Then the same in miniature for a qwen3_5_moe target
(every MLP an MoE block with a shared expert, its experts stored fused 3-D).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.models.qwen3_5")

from conftest import convert_cli  # noqa: E402
from hf_fixtures import as_multimodal, make_drafter, make_hybrid_target, make_tokenizer, rewrite_experts  # noqa: E402

from ddtree_jax.checkpoint import load_checkpoint, load_hf  # noqa: E402
from ddtree_jax.errors import UserError  # noqa: E402
from ddtree_jax.generator import Executables, Generator  # noqa: E402
from ddtree_jax.models import hybrid  # noqa: E402
from ddtree_jax.models.family import HybridCache  # noqa: E402

PROMPTS = [[5, 17, 3, 99, 42], list(range(10, 23))]  # different lengths: a right-padded batch
N = 24
REL = 1e-5
SHARED = Executables()  # the module's Generators share their prefills
CHUNK = 8  # the drafting Generators' prefill pieces: the 16 positions of the padded prompts in two
TYPES = ["linear_attention", "full_attention", "linear_attention"]  # the tiny targets' layers
TAPS = (1, 2)  # the drafters tap both kinds, the last one final-normed


@pytest.fixture(scope="module")
def hybrid_pair(tmp_path_factory):
    """(HF target dir (with a tokenizer), drafter dir, converted checkpoint dir, the transformers model)."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

    d = tmp_path_factory.mktemp("hybrid")
    target = make_hybrid_target(d / "hf", vocab=384, layer_types=TYPES)
    make_tokenizer(target, vocab_size=320)
    draft = make_drafter(d / "draft", target, layers=1, block_size=8, target_layer_ids=list(TAPS))
    convert_cli("--target", target, "--draft", draft, "--out", d / "out", "--dtype", "float32")
    mod = Qwen3_5ForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    return target, draft, d / "out", mod


@pytest.fixture(scope="module")
def ckpt(hybrid_pair):
    return load_checkpoint(hybrid_pair[2])


def _extra(ckpt) -> int:
    from tiny import oracle_extra

    return oracle_extra(ckpt)


@pytest.fixture(scope="module")
def hf_greedy(hybrid_pair, ckpt):
    """transformers' greedy continuation of each prompt (N + the oracle's extra tokens)."""
    mod = hybrid_pair[3]
    out = []
    for p in PROMPTS:
        with torch.no_grad():
            ids = mod.generate(torch.tensor([p]), max_new_tokens=N + _extra(ckpt), do_sample=False,
                               eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(p):].tolist())
    return out


def _close(got, want, rel: float = REL):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"


def _same(a, b) -> bool:
    return jax.tree.all(jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b))


def test_converted_and_multimodal_checkpoints_match_transformers(hybrid_pair, ckpt, tmp_path, capsys):
    target, draft, _, mod = hybrid_pair
    cfg = ckpt.target_cfg
    assert isinstance(cfg, hybrid.HybridConfig) and ckpt.meta["target"]["family"] == "qwen3_5"
    assert cfg.attn_layers == (1,) and ckpt.drafter_cfg.target_layer_ids == TAPS
    layer0, layer1 = ckpt.target_params["layers"][:2]
    assert layer0["linear"]["conv"].shape == (96, 1, 4) and layer1["qg"].shape == (64, 4 * 2 * 32)
    # read straight from the HF directory, and from the multimodal layout: the same params
    assert _same(load_hf(target, draft, dtype="float32").target_params, ckpt.target_params)
    capsys.readouterr()
    mm = load_hf(as_multimodal(target, tmp_path / "mm"), dtype="float32")
    assert "2 vision / multi-token-prediction tensors skipped" in capsys.readouterr().err
    assert mm.target_cfg == cfg and mm.target_cfg.architecture == "Qwen3_5ForConditionalGeneration"
    assert _same(mm.target_params, ckpt.target_params)
    # logits and the drafter's taps (HF's hidden_states[i + 1]) of the converted params
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 14)).astype(np.int32)
    params = jax.tree.map(jnp.asarray, ckpt.target_params)
    logits, tapped = jax.jit(hybrid.forward_train, static_argnames=("cfg", "taps"))(
        params, cfg, jnp.asarray(tokens), taps=TAPS)
    with torch.no_grad():
        out = mod(torch.tensor(tokens), use_cache=False, output_hidden_states=True)
    _close(logits, out.logits.numpy())
    _close(tapped, np.concatenate([out.hidden_states[i + 1].numpy() for i in TAPS], axis=-1))


def _tokens(results) -> list[list[int]]:
    return [r.token_ids for r in results]


@pytest.fixture(scope="module")
def ar(ckpt, hf_greedy):
    """AR's tokens, checked against transformers' greedy once: every method's reference."""
    got = _tokens(Generator(ckpt, executables=SHARED, method="ar").generate_ids(PROMPTS, max_new_tokens=N))
    assert got == [g[:N] for g in hf_greedy]
    return got


def test_dflash_with_a_chunked_prefill_matches_transformers(ckpt, ar):
    # pieces of 8: the shorter prompt's padding fills a whole piece, which must leave its state alone
    gen = Generator(ckpt, executables=SHARED, method="dflash", prefill_chunk=CHUNK)
    assert _tokens(gen.generate_ids(PROMPTS, max_new_tokens=N)) == ar


@pytest.fixture(scope="module")
def ddtree(ckpt):
    return Generator(ckpt, executables=SHARED, method="ddtree", budget=8, prefill_chunk=CHUNK)


def test_ddtree_matches_transformers_in_batches_and_alone(ckpt, ddtree, ar):
    assert _tokens(ddtree.generate_ids(PROMPTS, max_new_tokens=N)) == ar
    assert isinstance(ddtree._kept.cache, HybridCache)  # the target's state: KV, conv and recurrent states
    assert _tokens(ddtree.generate_ids(PROMPTS[1:], max_new_tokens=N)) == ar[1:]
    # fewer new tokens: traced, no recompile
    assert _tokens(ddtree.generate_ids(PROMPTS, max_new_tokens=19)) == [a[:19] for a in ar]


def _cut(tokens: list[int], stop: int) -> list[int]:
    return tokens[:tokens.index(stop) + 1] if stop in tokens else tokens


def test_deep_trees_commit_the_recurrent_state_of_the_accepted_path(ckpt, ar, hf_greedy):
    """A noisy oracle's trees of 32 accept long paths through side branches: every commit must
    leave the GDN states of plain decoding along them; a stop token inside such a path cuts there."""
    from tiny import oracle_params

    oracle = oracle_params(ckpt, PROMPTS, N, noise=1.5, greedy=hf_greedy)
    oracle["strength"] = jnp.float32(8.0)
    gen = Generator(ckpt, executables=SHARED, method="ddtree", budget=32, oracle=oracle)
    got = gen.generate_ids(PROMPTS, max_new_tokens=N)
    assert _tokens(got) == ar
    # a stop token inside an accepted path: the output ends at it (stop ids are traced: no recompile)
    stop = ar[0][9]
    assert _tokens(gen.generate_ids(PROMPTS, max_new_tokens=N, stop_ids=[stop])) == [_cut(a, stop) for a in ar]
    acc = [a for r in got for a in r.acceptance_lengths]
    assert max(acc) > 4 and np.mean(acc) > 2, acc


def test_a_conversation_cannot_continue_in_a_recurrent_cache(ddtree):
    with pytest.raises(UserError, match="cannot continue a conversation"):
        ddtree.generate_ids([[3, 4]], max_new_tokens=4, start=0)


# ---------------------------------------------------------------------------------------------
# Sampling: --budget auto (DFlash's chain or a DDTree tree, in one lax.switch) follows the target


def test_budget_auto_samples_follow_the_hybrid_targets_distribution(tmp_path):
    from scipy import stats

    from ddtree_jax.cost import CostModel, ModelSignature, Point

    rows, prompt = 2000, [1, 2, 3]
    target = make_hybrid_target(tmp_path / "hf", vocab=8, seed=3, layer_types=["linear_attention", "full_attention"])
    draft = make_drafter(tmp_path / "draft", target, layers=1, block_size=4, target_layer_ids=[0, 1])
    ck = load_hf(target, draft, dtype="float32")
    sig = ModelSignature.of(ck.target_cfg, ck.drafter_cfg, np.float32)
    points = [Point("dflash", b, 3, 4, 4.0) for b in (1, rows)]
    points += [Point("ddtree", b, 16, 4, 5.0) for b in (1, rows)]
    gen = Generator(ck, method="ddtree", budget="auto", auto_budgets=(16,),
                    cost_model=CostModel(jax.devices()[0].device_kind, sig, tuple(points)))
    assert gen.auto_lines(rows).candidates == ("dflash", 16)
    res = gen.generate_ids([prompt] * rows, max_new_tokens=2, temperature=1.0, seed=7)
    toks = np.array(_tokens(res))
    assert np.mean([a > 1 for r in res for a in r.acceptance_lengths]) > 0.05  # drafts were accepted
    # the exact joint p(x1, x2) from the target's logits
    v = ck.target_cfg.vocab_size
    seqs = np.array([prompt + [a] for a in range(v)], np.int32)
    logits, _ = hybrid.forward_train(jax.tree.map(jnp.asarray, ck.target_params), ck.target_cfg, jnp.asarray(seqs))
    p = np.asarray(jax.nn.softmax(logits, -1), np.float64)
    p = p / p.sum(-1, keepdims=True)
    joint = p[0, len(prompt) - 1][:, None] * p[:, len(prompt)]
    counts = np.zeros((v, v))
    np.add.at(counts, (toks[:, 0], toks[:, 1]), 1)
    exp = joint.ravel() * rows
    small = exp < 5
    obs = np.append(counts.ravel()[~small], counts.ravel()[small].sum())
    ex = np.append(exp[~small], exp[small].sum())
    assert stats.chisquare(obs, ex).pvalue > 1e-3


# ---------------------------------------------------------------------------------------------
# Bad input: one line, exit 2, nothing written


def _fails(capsys, main, args, prog) -> str:
    rc = main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("note:")]
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def _broken_copy(src: Path, dst: Path, *, config=None, tensors=None) -> Path:
    from safetensors.numpy import load_file, save_file

    d = Path(shutil.copytree(src, dst))
    if config is not None:
        c = json.loads((d / "config.json").read_text())
        config(c)
        (d / "config.json").write_text(json.dumps(c))
    if tensors is not None:
        t = load_file(d / "model.safetensors")
        tensors(t)
        save_file(t, d / "model.safetensors")
    return d


BAD = [
    ("tensors", lambda t: t.pop("model.layers.2.linear_attn.dt_bias"),
     "tensor 'model.layers.2.linear_attn.dt_bias' is missing (expected shape [4])"),
    ("tensors", lambda t: t.update({"model.layers.0.linear_attn.conv1d.weight": np.zeros((96, 1, 3), np.float32)}),
     "tensor 'model.layers.0.linear_attn.conv1d.weight' has shape [96, 1, 3], expected [96, 1, 4]"),
    ("tensors", lambda t: t.update({"model.layers.1.self_attn.q_proj.weight": np.zeros((128, 64), np.float32)}),
     "tensor 'model.layers.1.self_attn.q_proj.weight' has shape [128, 64], expected [256, 64]"),
    ("config", lambda c: c.update(layer_types=["linear_attention", "mamba", "linear_attention"]),
     "layer_types is"),
    ("config", lambda c: c.update(linear_num_value_heads=3), "linear_num_value_heads (3) is not a multiple"),
    ("config", lambda c: c["rope_parameters"].update(partial_rotary_factor=1.5), "partial_rotary_factor is 1.5"),
    ("config", lambda c: c.update(linear_conv_kernel_dim=0), "linear_conv_kernel_dim is 0"),
]


@pytest.mark.parametrize("what, edit, needle", BAD)
def test_bad_checkpoints_are_one_line(hybrid_pair, tmp_path, capsys, what, edit, needle):
    from convert import main as convert_main
    from ddtree_jax.cli import main as generate_main
    from ddtree_jax.errors import cli_main

    hf = _broken_copy(hybrid_pair[0], tmp_path / "hf", **{what: edit})
    capsys.readouterr()
    out = tmp_path / "out"
    line = _fails(capsys, convert_main, ["--target", hf, "--out", out, "--dtype", "float32"], "convert")
    assert needle in line and not out.exists() and not list(tmp_path.glob("out.*")), line
    line = _fails(capsys, lambda a: cli_main(generate_main, a, prog="ddtree_jax.generate"),
                  ["--target", hf, "--method", "ar", "--prompt", "x", "--max-new-tokens", "1"], "ddtree_jax.generate")
    assert needle in line, line


# ---------------------------------------------------------------------------------------------
# qwen3_5_moe: the MoE block of models/moe.py behind the same layers


@pytest.fixture(scope="module")
def moe_pair(tmp_path_factory):
    """(HF dir as saved (one tensor per expert), converted checkpoint of its fused-experts copy,
    the transformers model)."""
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    d = tmp_path_factory.mktemp("hybrid_moe")
    target = make_hybrid_target(d / "hf", layer_types=TYPES, experts=8, top_k=2)
    fused = Path(shutil.copytree(target, d / "hf_fused"))
    rewrite_experts(fused, "fused")
    draft = make_drafter(d / "draft", target, layers=1, block_size=8, target_layer_ids=list(TAPS), intermediate=64)
    convert_cli("--target", fused, "--draft", draft, "--out", d / "out", "--dtype", "float32")
    mod = Qwen3_5MoeForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    return target, d / "out", mod


def test_moe_checkpoints_match_transformers(moe_pair):
    target, out, mod = moe_pair
    ck = load_checkpoint(out)
    cfg = ck.target_cfg
    assert cfg.family == "qwen3_5_moe" and cfg.moe.num_experts == 8 and cfg.moe.shared_intermediate == 48
    layer = ck.target_params["layers"][0]
    assert layer["experts_gate"].shape == (8, 64, 32) and layer["shared_expert_gate"].shape == (64, 1)
    assert _same(load_hf(target, dtype="float32").target_params, ck.target_params)  # either expert layout
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 14)).astype(np.int32)
    logits, tapped = jax.jit(hybrid.forward_train, static_argnames=("cfg", "taps"))(
        jax.tree.map(jnp.asarray, ck.target_params), cfg, jnp.asarray(tokens), taps=TAPS)
    with torch.no_grad():
        want = mod(torch.tensor(tokens), use_cache=False, output_hidden_states=True)
    # transformers sums a token's experts in another order: a little more float32 rounding
    _close(logits, want.logits.numpy(), rel=1e-4)
    _close(tapped, np.concatenate([want.hidden_states[i + 1].numpy() for i in TAPS], axis=-1), rel=1e-4)


def test_moe_ddtree_matches_transformers(moe_pair):
    _, out, mod = moe_pair
    want = []
    for p in PROMPTS:
        with torch.no_grad():
            ids = mod.generate(torch.tensor([p]), max_new_tokens=16, do_sample=False, eos_token_id=None,
                               pad_token_id=0)
        want.append(ids[0, len(p):].tolist())
    gen = Generator(load_checkpoint(out), method="ddtree", budget=8)
    assert _tokens(gen.generate_ids(PROMPTS, max_new_tokens=16)) == want


def test_bad_moe_checkpoints_are_one_line(moe_pair, tmp_path, capsys):
    from convert import main as convert_main

    missing = "model.layers.2.mlp.experts.5.up_proj.weight"
    hf = _broken_copy(moe_pair[0], tmp_path / "hf", tensors=lambda t: t.pop(missing))
    capsys.readouterr()
    line = _fails(capsys, convert_main, ["--target", hf, "--out", tmp_path / "out"], "convert")
    assert f"tensor '{missing}' is missing (expected shape [32, 64])" in line
    hf = _broken_copy(moe_pair[0], tmp_path / "hf2", config=lambda c: c.update(num_experts_per_tok=9))
    line = _fails(capsys, convert_main, ["--target", hf, "--out", tmp_path / "out"], "convert")
    assert "num_experts_per_tok is 9; it must be at most num_experts (8)" in line


def test_interactive_chat_prefills_the_whole_conversation(hybrid_pair, tmp_path, monkeypatch, capsys):
    """--interactive with a recurrent target: every turn is a fresh request over the whole
    conversation (its state cannot restart inside the cache), and each reply is what that request
    generates."""
    import io
    import sys

    from ddtree_jax import cli
    from ddtree_jax.tokenizer import Tokenizer

    ck = Path(shutil.copytree(hybrid_pair[2], tmp_path / "ck"))
    cfg_file = ck / "tokenizer" / "tokenizer_config.json"
    (ck / "tokenizer" / "chat_template.jinja").unlink(missing_ok=True)
    chat = ("{% for m in messages %}<|endoftext|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|endoftext|>assistant:{% endif %}")
    cfg_file.write_text(json.dumps(dict(json.loads(cfg_file.read_text()), chat_template=chat)))
    turns = ["def f(x):", "import os"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(turns) + "\n"))
    starts, real = [], Generator.generate_ids
    monkeypatch.setattr(Generator, "generate_ids", lambda self, prompts, **kw: starts.append(kw.get("start")) or
                        real(self, prompts, **kw))
    assert cli.main(["--ckpt", str(ck), "--interactive", "--max-new-tokens", "6", "--budget", "8",
                     "--ignore-eos"]) == 0
    replies = capsys.readouterr().out.splitlines()
    monkeypatch.setattr(Generator, "generate_ids", real)
    assert starts == [None, None] and len(replies) == 2
    tok = Tokenizer(ck / "tokenizer")
    gen = Generator(load_checkpoint(ck, dtype="float32"), method="ddtree", budget=8)
    messages = []
    for turn, reply in zip(turns, replies):
        messages.append({"role": "user", "content": turn})
        ids = tok.encode(tok.apply_chat_template(messages), add_special_tokens=False)
        assert reply == tok.decode(gen.generate_ids([ids], max_new_tokens=6)[0].token_ids)
        messages.append({"role": "assistant", "content": reply})
