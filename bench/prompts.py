"""Benchmark prompts: the first N tokens of each held-out document of a corpus, or a prompt file.

The default set ships with the repository, `bench/data/eval_prompts.jsonl.xz`: the `eval` split
of the Python 3.11.7 standard-library corpus the shipped pair was trained on (75 files, Python
Software Foundation License), each cut to its first `EVAL_CHARS` characters, one JSON object a
line (`path`, `split`, `text`). Prompts are taken in file order, files shorter than N tokens
skipped, so that every prompt has exactly N tokens and every method sees the same inputs.
`--data FILE` takes any corpus of that format instead (a `split` field, or the hash split of
`ddtree_jax.train.data`).

    python -m bench prompts --from CORPUS.jsonl.xz     # rebuild the shipped file from the full corpus
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import lzma
import sys
import types
from pathlib import Path

from ddtree_jax.errors import UserError, cli_main

EVAL_PROMPTS = Path(__file__).resolve().parent / "data" / "eval_prompts.jsonl.xz"
# from_corpus tokenizes 16 characters a token plus 64 of each document: the shipped cut gives the
# same prompts as the whole documents up to 512 tokens
EVAL_CHARS = 16 * 512 + 64


def default_data() -> Path:
    """The corpus the benchmarks read unless given --data: the shipped eval prompts."""
    return EVAL_PROMPTS


@dataclasses.dataclass(frozen=True)
class Prompt:
    index: int  # position in the benchmark's prompt list
    source: str  # "eval[i]" (i-th file of the eval split) or "FILE:line"
    ids: tuple[int, ...]


def from_corpus(tokenizer, path: str | Path, num_prompts: int, prompt_tokens: int) -> list[Prompt]:
    """The first `prompt_tokens` tokens of the first `num_prompts` eval files that are long enough."""
    from ddtree_jax.train.data import eval_prompts

    return [Prompt(k, f"eval[{i}]", tuple(ids))
            for k, (i, ids) in enumerate(eval_prompts(tokenizer, path, num_prompts, prompt_tokens))]


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


def write_eval_prompts(corpus: str | Path, out: str | Path = EVAL_PROMPTS, chars: int = EVAL_CHARS) -> int:
    """Every eval document of `corpus` cut to its first `chars` characters, as `out` (xz JSONL,
    byte-identical for the same corpus). Returns the number of documents."""
    from ddtree_jax.errors import open_text
    from ddtree_jax.train.data import _split_of, check_data_file

    lines = []
    with open_text(check_data_file(corpus)) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                if _split_of(record) == "eval":
                    lines.append(json.dumps({"path": record.get("path", f"eval[{len(lines)}]"), "split": "eval",
                                             "text": record["text"][:chars]}) + "\n")
    if not lines:
        raise UserError(f"{corpus} has no eval documents")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_bytes(lzma.compress("".join(lines).encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    return len(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench prompts", description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="corpus", required=True, help="the full corpus (JSONL[.xz] with split and text)")
    ap.add_argument("--out", default=str(EVAL_PROMPTS))
    ap.add_argument("--chars", type=int, default=EVAL_CHARS, help="characters kept of each document")
    args = ap.parse_args(argv)
    n = write_eval_prompts(args.corpus, args.out, args.chars)
    print(f"[prompts] {n} eval documents, {Path(args.out).stat().st_size} bytes: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main, prog="bench prompts"))
