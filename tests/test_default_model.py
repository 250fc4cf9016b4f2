"""The shipped pair (ddtree_jax/default_model): transformers agrees with us, DDTree is lossless on it."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
import torch

from ddtree_jax.checkpoint import DEFAULT_CKPT, load_checkpoint
from ddtree_jax.generator import Generator
from ddtree_jax.train.export import export_checkpoint

# The first documents of the corpus's held-out split (default_model/README.md), kept in the repo.
EVAL_PROMPTS = Path(__file__).resolve().parents[1] / "bench" / "data" / "eval_prompts.jsonl.xz"


@pytest.fixture(scope="module")
def shipped():
    # float32 on both sides: the bf16 weights upcast exactly, so only float32 rounding differs
    return load_checkpoint(DEFAULT_CKPT, dtype="float32")


@pytest.fixture(scope="module")
def eval_prompts(shipped):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shipped.tokenizer_dir))
    with lzma.open(EVAL_PROMPTS, "rt") as f:
        texts = [row["text"] for row in map(json.loads, f) if row["split"] == "eval"][:8]
    assert len(texts) == 8, f"{EVAL_PROMPTS} holds {len(texts)} eval documents, 8 wanted"
    return [tok.encode(t, add_special_tokens=False)[: 48 + 8 * i] for i, t in enumerate(texts)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The shipped pair in Hugging Face form: (target dir, draft dir)."""
    return export_checkpoint(DEFAULT_CKPT, tmp_path_factory.mktemp("shipped") / "hf")


def test_shipped_pair_exports_to_hugging_face_bit_for_bit(exported):
    """The pair is stored only converted; its Hugging Face form comes back exactly: every tensor,
    in bf16, reads back as the checkpoint's param."""
    import jax

    from ddtree_jax.checkpoint import load_hf

    ck = load_checkpoint(DEFAULT_CKPT)
    target, draft = exported
    hf = load_hf(target, draft, dtype="bfloat16")
    for kind, path, params, back in [("target", target, ck.target_params, hf.target_params),
                                     ("drafter", draft, ck.drafter_params, hf.drafter_params)]:
        want, got = jax.tree_util.tree_leaves_with_path(params), jax.tree_util.tree_leaves_with_path(back)
        assert [p for p, _ in got] == [p for p, _ in want], kind
        for (p, a), (_, b) in zip(want, got):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), (kind, jax.tree_util.keystr(p))
        assert (path / "tokenizer.json").is_file()


def test_transformers_loads_shipped_target_and_agrees(shipped, eval_prompts, exported):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(exported[0]), torch_dtype=torch.float32).eval()
    prompt = eval_prompts[0]
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                          max_new_tokens=48, do_sample=False, eos_token_id=None, pad_token_id=0)
    ours = Generator(shipped, method="ar").generate_ids([prompt], max_new_tokens=48)[0].token_ids
    assert ours == ref[0, len(prompt):].tolist()


def test_ddtree_on_shipped_pair_equals_ar_on_eval_prompts(shipped, eval_prompts):
    ar = Generator(shipped, method="ar").generate_ids(eval_prompts, max_new_tokens=64)
    for method, budget in [("dflash", 0), ("ddtree", 64)]:
        res = Generator(shipped, method=method, budget=budget or 64).generate_ids(eval_prompts, max_new_tokens=64)
        assert [r.token_ids for r in res] == [r.token_ids for r in ar], method
        mean = sum(a for r in res for a in r.acceptance_lengths) / sum(r.rounds for r in res)
        assert mean > 2.0, (method, mean)  # a trained drafter, not a random one
