"""Token maps: the part of the vocabulary a drafter drafts over (`--draft-vocab FILE`).

A DFlash drafter reads the target's whole LM head every round (151,936 x 4,096 for Qwen3-8B:
1.24 GB, a quarter of a DDTree-64 round's draft stage on the H200). Most of those rows are tokens
that are almost never the next one. A token map keeps the V' most frequent tokens: the drafter's
head is cut to them (drafters.dflash.restrict_vocab), so a draft reads V'/V of those bytes, and the
tree policies rank V' candidates. This is FR-Spec's frequency-ranked drafting (Zhao et al., 2025),
SGLang's `--speculative-token-map`. Lossless either way: the target verifies every token with
its full head; a token outside the map is simply never proposed (acceptance may drop a little).

File format: a JSON list of token ids, or whitespace-separated ids (one per line is fine), each
id once. Build one from a text corpus with the checkpoint's tokenizer:

    python -m ddtree_jax.token_map --ckpt DIR --data corpus.jsonl.xz --size 32768 --out map.json

(`--data`: text, or JSONL with a "text" / "prompt" field, optionally .xz / .gz; the tokenizer's
special tokens are always kept.) The output path is checked before the corpus is counted; an
empty corpus is refused; a corpus with fewer distinct tokens than `--size` gives a smaller map,
with a warning on stderr.
"""
from __future__ import annotations

import collections
import json
import lzma
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from ddtree_jax.errors import ArgumentParser, UserError, json_line_text, open_text, read_text_file


def read_token_map(path: str | Path) -> list[int]:
    """The ids of a token-map file, in its order; UserError (one line) for a file that is missing,
    unreadable, or holds anything but distinct non-negative integers (check_token_map)."""
    path = Path(path)
    text = read_text_file(path, "token map", missing="; build one with python -m ddtree_jax.token_map")
    if text.lstrip().startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"token map {path} is not valid JSON ({e.msg} at line {e.lineno}); "
                            "give a JSON list of token ids, or ids separated by whitespace") from None
    else:
        items = text.split()
    ids = []
    for n, item in enumerate(items):
        try:
            if isinstance(item, bool) or not isinstance(item, (int, str)):
                raise ValueError
            ids.append(int(item))
        except ValueError:
            raise UserError(f"token map {path}: entry {n} is {item!r}, not a token id") from None
    check_token_map(ids, where=f"token map {path}")
    return ids


def check_token_map(ids: Sequence[int], vocab_size: int | None = None, *, where: str = "the token map") -> None:
    """UserError unless `ids` is a non-empty list of distinct ids >= 0 (and < vocab_size if given)."""
    if not len(ids):
        raise UserError(f"{where} is empty; it needs the token ids to draft over")
    seen = set()
    for n, tid in enumerate(ids):
        if tid < 0:
            raise UserError(f"{where}: entry {n} is {tid}, token ids are >= 0")
        if tid in seen:
            raise UserError(f"{where}: token {tid} appears twice (again at entry {n}); the ids must be distinct")
        seen.add(tid)
    bad = [t for t in ids if vocab_size is not None and t >= vocab_size]
    if bad:
        raise UserError(f"{where} has token id {bad[0]} (and {len(bad) - 1} more) beyond the target's vocabulary "
                        f"of {vocab_size}; build it with this checkpoint's tokenizer")


# ---------------------------------------------------------------------- building one from a corpus

def corpus_texts(path: str | Path) -> Iterator[str]:
    """The documents of a corpus file: JSONL lines with a "text" (or "prompt") field, else each
    non-empty line as text. UserError for a missing file or a JSON line without such a field."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"corpus {path} not found")
    try:
        with open_text(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if line.lstrip().startswith("{"):
                    yield json_line_text(line, f"{path}:{n}", ("text", "prompt"))
                else:
                    yield line
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read corpus {path}: {e}") from None


def most_frequent(token_lists: Iterable[Sequence[int]], size: int, keep: Sequence[int] = ()) -> list[int]:
    """The `size` most frequent ids (ties: the smaller id first), `keep` first (always in), each
    id once. Fewer if the corpus has fewer distinct ids."""
    counts = collections.Counter()
    for ids in token_lists:
        counts.update(ids)
    out = list(dict.fromkeys(int(t) for t in keep))
    chosen = set(out)
    for tid, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(out) >= size:
            break
        if tid not in chosen:
            out.append(int(tid))
            chosen.add(tid)
    return out[:max(size, len(keep))]


def check_output(path: str | Path, force: bool = False) -> Path:
    """Refuse, before any counting, an output that exists (unless `force`), is a directory, or lies
    where no file can be created (a probe file is made and removed in the nearest existing folder)."""
    given = Path(path)
    if given.is_dir():
        raise UserError(f"--out {given} is a directory; give a file name, e.g. {given / 'map.json'}")
    if (given.exists() or given.is_symlink()) and not force:
        raise UserError(f"{given} already exists; pass --force to replace it, or choose another output file")
    folder = given.absolute().parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"cannot write {given}: {folder} is a file, not a folder; choose another --out")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f"cannot write to {folder} ({e.strerror or e}); choose another --out") from None
    return given


def write_token_map(path: str | Path, ids: Sequence[int], force: bool = False) -> Path:
    """Write ids as a JSON list, atomically (a temporary sibling renamed into place)."""
    path = Path(path)
    if path.exists() and not force:
        raise UserError(f"{path} already exists; pass --force to replace it, or choose another output file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps([int(t) for t in ids]) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _load_tokenizer(tok_dir: Path):
    from ddtree_jax.tokenizer import Tokenizer

    return Tokenizer(tok_dir)


def build_parser() -> ArgumentParser:
    ap = ArgumentParser(prog="python -m ddtree_jax.token_map",
                        description="Build a token map (the ids a drafter drafts over, --draft-vocab) from a text "
                                    "corpus: its most frequent tokens.")
    ap.add_argument("--ckpt", required=True, help="converted checkpoint whose tokenizer counts the corpus")
    ap.add_argument("--data", required=True, help="corpus: text, or JSONL with a \"text\" field (.xz / .gz too); "
                                                  "an empty corpus is refused")
    ap.add_argument("--size", type=int, default=32768,
                    help="how many tokens to keep (default 32768); a corpus with fewer distinct tokens (or a smaller "
                         "vocabulary) gives a smaller map, with a warning on stderr")
    ap.add_argument("--out", required=True, help="output file (a JSON list of token ids); checked before counting")
    ap.add_argument("--force", action="store_true", help="replace an existing output file")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ddtree_jax.checkpoint import read_target_config, tokenizer_dir

    if args.size < 1:
        raise UserError(f"--size must be >= 1 (got {args.size})")
    out = check_output(args.out, args.force)
    data = Path(args.data)
    if not data.is_file():
        raise UserError(f"corpus {data} not found")
    if data.stat().st_size == 0:
        raise UserError(f"corpus {data} is empty; give a corpus of text in the domain the drafter will see")
    vocab = read_target_config(args.ckpt).vocab_size
    tok_dir = tokenizer_dir(args.ckpt)
    if tok_dir is None:
        raise UserError(f"{args.ckpt} has no tokenizer files; reconvert with a target directory that has them")
    tok = _load_tokenizer(tok_dir)
    special = [t for t in tok.all_special_ids if 0 <= t < vocab]
    t0, docs, tokens = time.perf_counter(), 0, 0

    def encoded():
        nonlocal docs, tokens
        for text in corpus_texts(data):
            ids = tok.encode(text, add_special_tokens=False)
            docs += 1
            tokens += len(ids)
            if docs % 200 == 0:
                print(f"[token_map] {docs} documents, {tokens} tokens ({time.perf_counter() - t0:.0f}s)",
                      file=sys.stderr, flush=True)
            yield [t for t in ids if t < vocab]

    ids = most_frequent(encoded(), min(args.size, vocab), keep=special)
    if tokens == 0:
        raise UserError(f"corpus {data} has no text ({docs} documents, no tokens); give a corpus of text in the "
                        "domain the drafter will see")
    write_token_map(out, ids, force=args.force)
    print(f"[token_map] {len(ids)} tokens of {vocab} from {docs} documents ({tokens} tokens) -> {out}",
          file=sys.stderr, flush=True)
    if len(ids) < args.size:
        why = (f"the vocabulary has {vocab} tokens" if len(ids) >= vocab else
               f"the corpus has only {len(ids)} distinct tokens (special tokens included); a larger corpus fills more")
        print(f"[token_map] warning: the map holds {len(ids)} tokens, fewer than --size {args.size}: {why}",
              file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    from ddtree_jax.errors import run_script

    run_script(main, prog="ddtree_jax.token_map")
