"""Benchmark prompts: the first N tokens of each held-out file of the corpus, or a prompt file.

The default set is deterministic: the `eval` split of the Python stdlib corpus in file order,
files shorter than N tokens skipped, so that every prompt has exactly N tokens and every method
sees the same inputs.
"""
from __future__ import annotations

import dataclasses
import types
from pathlib import Path

from ddtree_jax.errors import UserError

ROOT = Path(__file__).resolve().parent.parent
DATA_NAME = "pystdlib-3.11.7.jsonl.xz"
# The corpus lives beside the checkout (../shared/data), inside it on the device machine
# (shared/data), or in carry/train_data (bench/train_gpu.sh).
DATA_CANDIDATES = (ROOT.parent / "shared" / "data" / DATA_NAME, ROOT / "shared" / "data" / DATA_NAME,
                   ROOT / "carry" / "train_data" / DATA_NAME)


def default_data() -> Path:
    return next((p for p in DATA_CANDIDATES if p.is_file()), DATA_CANDIDATES[0])


@dataclasses.dataclass(frozen=True)
class Prompt:
    index: int  # position in the benchmark's prompt list
    source: str  # "eval[i]" (i-th file of the eval split) or "FILE:line"
    ids: tuple[int, ...]


def from_corpus(tokenizer, path: str | Path, num_prompts: int, prompt_tokens: int) -> list[Prompt]:
    """The first `prompt_tokens` tokens of the first `num_prompts` eval files that are long enough."""
    from ddtree_jax.train.data import iter_texts

    prompts: list[Prompt] = []
    # ~4 characters a token on this corpus: tokenising a generous prefix keeps this cheap. The
    # tokens next to the cut may differ from the full text's, so a margin of them is never kept.
    chars, margin = 16 * prompt_tokens + 64, 8
    for i, text in enumerate(iter_texts(path, "eval")):
        cut = len(text) > chars
        ids = tokenizer.encode(text[:chars] if cut else text, add_special_tokens=False)
        if cut and len(ids) < prompt_tokens + margin:
            ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < prompt_tokens:
            continue
        prompts.append(Prompt(len(prompts), f"eval[{i}]", tuple(ids[:prompt_tokens])))
        if len(prompts) == num_prompts:
            break
    if not prompts:
        raise UserError(f"no eval document of {path} has {prompt_tokens} tokens; lower --prompt-tokens")
    return prompts


def read_file(path: str | Path) -> list[str]:
    """The prompts of a file: one per line (\\n escapes), or JSONL with "prompt"/"text" (UserError if none)."""
    from ddtree_jax.cli import _load_prompts

    return _load_prompts(types.SimpleNamespace(prompt=None, prompt_file=str(path)))


def from_texts(tokenizer, texts: list[str], name: str, num_prompts: int, prompt_tokens: int) -> list[Prompt]:
    """The first `num_prompts` texts, each cut to its first `prompt_tokens` tokens."""
    prompts = []
    for n, text in enumerate(texts[:num_prompts]):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise UserError(f"prompt {n + 1} of {name} encodes to no tokens; remove it")
        prompts.append(Prompt(n, f"{name}:{n + 1}", tuple(ids[:prompt_tokens])))
    return prompts
