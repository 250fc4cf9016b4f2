"""The shipped pair (ddtree_jax/default_model): transformers agrees with us, DDTree is lossless on it."""
from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest
import torch

from ddtree_jax.checkpoint import load_checkpoint
from ddtree_jax.checkpoint import DEFAULT_CKPT
from ddtree_jax.generator import Generator

HF_TARGET = DEFAULT_CKPT.parent / "hf" / "target"
CORPUS = Path(__file__).resolve().parents[2] / "shared" / "data" / "pystdlib-3.11.7.jsonl.xz"


@pytest.fixture(scope="module")
def shipped():
    # float32 on both sides: the bf16 weights upcast exactly, so only float32 rounding differs
    return load_checkpoint(DEFAULT_CKPT, dtype="float32")


@pytest.fixture(scope="module")
def eval_prompts(shipped):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shipped.tokenizer_dir))
    texts = []
    if CORPUS.is_file():
        with lzma.open(CORPUS, "rt") as f:
            for line in f:
                row = json.loads(line)
                if row["split"] == "eval":
                    texts.append(row["text"])
                if len(texts) == 8:
                    break
    else:  # the corpus lives beside the checkout; keep the test meaningful without it
        texts = [f"import os\n\n\ndef helper_{i}(path):\n    " for i in range(8)]
    return [tok.encode(t, add_special_tokens=False)[: 48 + 8 * i] for i, t in enumerate(texts)]


def test_transformers_loads_shipped_target_and_agrees(shipped, eval_prompts):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(HF_TARGET), torch_dtype=torch.float32).eval()
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
