"""ddtree_jax.tokenizer reads a checkpoint's tokenizer as transformers does, without importing it:
the same ids (the tokenizer's own BOS included), the same text back, the same chat prompts."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from ddtree_jax.checkpoint import DEFAULT_CKPT
from ddtree_jax.errors import UserError
from ddtree_jax.tokenizer import Tokenizer

TEXTS = ["def f(x):\n    return x  # café ✓", "<|endoftext|>hello", "  spaces\t\ttabs\n\n", "The quick brown fox."]
# a Qwen-style template: system message, roles, generation prompt
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f(x):"}]


def _llama3_style(dir: Path, chat_template: str | None = None) -> Path:
    """A byte-level BPE tokenizer whose post-processor puts <|begin_of_text|> first, as Llama 3's."""
    from tokenizers import Tokenizer as Fast
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Fast(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TEXTS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(dir)
    return dir


def _same_as_transformers(ours: Tokenizer, directory: Path):
    from transformers import AutoTokenizer

    theirs = AutoTokenizer.from_pretrained(str(directory))
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special)
        ids = theirs.encode(text)
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids, skip_special_tokens=False)
    assert ours.eos_token_id == theirs.eos_token_id
    return theirs


def test_the_shipped_tokenizer_as_transformers_reads_it():
    _same_as_transformers(Tokenizer(DEFAULT_CKPT / "tokenizer"), DEFAULT_CKPT / "tokenizer")


def test_a_llama3_style_bos_comes_first_as_in_transformers(tmp_path):
    d = _llama3_style(tmp_path / "tok")
    ours = Tokenizer(d)
    _same_as_transformers(ours, d)
    bos = ours.bos_token_id
    assert ours.encode("hello")[0] == bos and ours.encode("hello", add_special_tokens=False)[0] != bos
    from ddtree_jax.cli import _encode

    plain = types.SimpleNamespace(chat=False, system=None)
    assert _encode(ours, "hello", plain)[0] == bos  # the CLI encodes prompts as transformers does


def test_chat_template_renders_as_transformers(tmp_path):
    d = _llama3_style(tmp_path / "tok", chat_template=CHAT)
    ours = Tokenizer(d)
    theirs = _same_as_transformers(ours, d)
    want = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES) == want
    from ddtree_jax.cli import _encode

    chat = types.SimpleNamespace(chat=True, system="Be brief.")
    assert _encode(ours, "def f(x):", chat) == theirs.encode(want, add_special_tokens=False)


def test_bad_chat_templates_are_one_line_errors(tmp_path):
    d = _llama3_style(tmp_path / "tok", chat_template="{% for m in messages %}{{ m['content'] }")
    with pytest.raises(UserError, match="syntax error at line 1"):
        Tokenizer(d).apply_chat_template(MESSAGES)
    raising = "{{ raise_exception('only user turns') }}"
    if (d / "chat_template.jinja").is_file():  # where transformers 5 saves it
        (d / "chat_template.jinja").write_text(raising)
    else:
        cfg = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=raising)))
    with pytest.raises(UserError, match="only user turns"):
        Tokenizer(d).apply_chat_template(MESSAGES)
    with pytest.raises(UserError, match="no chat template"):
        Tokenizer(DEFAULT_CKPT / "tokenizer").apply_chat_template(MESSAGES)
