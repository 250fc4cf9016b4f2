"""Training data: JSONL documents -> token stream -> packed fixed-length sequences.

Input: one JSON object per line with a `text` field (optionally `.xz`/`.gz` compressed). The
shared corpus also has `split` (`train`/`eval`); for files without it, a document is held out
when sha256(text) mod 20 == 0, so the held-out set is still deterministic.

Documents are joined with `<|endoftext|>` and cut into sequences of `seq_len` tokens. Each
epoch re-orders the documents (seeded by the epoch number), so sequence boundaries differ from
epoch to epoch while `batch(step)` stays a pure function of the step: resuming replays the
same data order.
"""
from __future__ import annotations

import hashlib
import lzma
import json
from pathlib import Path
from typing import Iterator

import numpy as np

from ddtree_jax.errors import UserError, open_text

SPLITS = ("train", "eval")


def _split_of(record: dict) -> str:
    split = record.get("split")
    if split is not None:
        return str(split)
    digest = hashlib.sha256(record["text"].encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:8], "big") % 20 == 0 else "train"


def check_data_file(path: str | Path) -> Path:
    p = Path(path)
    if not p.exists():
        raise UserError(f"data file {p} not found; pass a JSONL file with a 'text' field per line (.jsonl, .jsonl.xz)")
    if not p.is_file():
        raise UserError(f"data {p} is not a file; pass a JSONL file with a 'text' field per line")
    return p


def iter_texts(path: str | Path, split: str | None = None) -> Iterator[str]:
    """The `text` of every document of `split` (None: all), in file order."""
    p = check_data_file(path)
    try:
        with open_text(p) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise UserError(f"{p}:{lineno} is not valid JSON ({e.msg}); expected one JSON object per line") from None
                if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                    raise UserError(f"{p}:{lineno} has no string field 'text'; expected {{\"text\": ...}} per line")
                if split is None or _split_of(record) == split:
                    yield record["text"]
    except (lzma.LZMAError, EOFError, OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {p} ({e}); is it a (compressed) UTF-8 JSONL file?") from None



def eval_prompts(tokenizer, path: str | Path, num_prompts: int,
                 prompt_tokens: int) -> list[tuple[int, list[int]]]:
    """(document index, its first `prompt_tokens` tokens) of the first `num_prompts` eval documents
    of `path` that are long enough: the benchmarks' and the replay records' prompts."""
    out: list[tuple[int, list[int]]] = []
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
        out.append((i, list(ids[:prompt_tokens])))
        if len(out) == num_prompts:
            break
    if not out:
        raise UserError(f"no eval document of {path} has {prompt_tokens} tokens; lower --prompt-tokens")
    return out


def read_texts(path: str | Path, split: str | None = None) -> list[str]:
    texts = [t for t in iter_texts(path, split) if t]
    if not texts:
        which = f" of split {split!r}" if split else ""
        raise UserError(f"{path} has no non-empty documents{which}; check the file (and its 'split' fields)")
    return texts


def tokenize_docs(tokenizer, texts: list[str], eos_id: int) -> list[np.ndarray]:
    """Each document's token ids followed by eos (batch-encoded)."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [np.asarray(list(x) + [eos_id], np.int32) for x in ids]


def pack(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """Cut a token stream into [N, seq_len] (the tail that does not fill a sequence is dropped)."""
    n = len(stream) // seq_len
    return stream[: n * seq_len].reshape(n, seq_len)


class PackedData:
    """Deterministic, resumable batches of packed training sequences."""

    def __init__(self, docs: list[np.ndarray], seq_len: int, batch_size: int, seed: int = 0):
        self.docs = docs
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.num_tokens = int(sum(len(d) for d in docs))
        self.num_sequences = self.num_tokens // seq_len
        if self.num_sequences < batch_size:
            raise UserError(
                f"the training data has {self.num_tokens} tokens: fewer than one batch of {batch_size} x {seq_len}; "
                f"use more data or a smaller --batch-size/--seq-len"
            )
        self.steps_per_epoch = self.num_sequences // batch_size
        self._epoch: tuple[int, np.ndarray] | None = None

    def _packed(self, epoch: int) -> np.ndarray:
        if self._epoch is None or self._epoch[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            order = rng.permutation(len(self.docs))
            seqs = pack(np.concatenate([self.docs[i] for i in order]), self.seq_len)
            self._epoch = (epoch, seqs[rng.permutation(len(seqs))])
        return self._epoch[1]

    def batch(self, step: int) -> np.ndarray:
        """The int32 [batch_size, seq_len] batch of training step `step` (0-based)."""
        epoch, i = divmod(step, self.steps_per_epoch)
        b = self.batch_size
        return self._packed(epoch)[i * b:(i + 1) * b]


def eval_sequences(docs: list[np.ndarray], seq_len: int, max_sequences: int | None = None) -> np.ndarray:
    """The held-out set: eval documents in file order, packed; the first `max_sequences`."""
    seqs = pack(np.concatenate(docs), seq_len)
    if len(seqs) == 0:
        raise UserError(f"the held-out split has fewer than {seq_len} tokens; use a smaller --seq-len or more eval data")
    return seqs[:max_sequences] if max_sequences else seqs


def load_docs(tokenizer, path: str | Path, split: str, cache_dir: str | Path | None = None) -> list[np.ndarray]:
    """`tokenize_docs` of one split, cached in `cache_dir` (keyed by the data file's identity and the
    tokenizer's vocabulary) so the target and drafter runs tokenize the corpus once."""
    eos = tokenizer.eos_token_id
    if cache_dir is None:
        return tokenize_docs(tokenizer, read_texts(path, split), eos)
    p = check_data_file(path)
    st = p.stat()
    key = hashlib.sha256(json.dumps([str(p.resolve()), st.st_size, st.st_mtime_ns, split, eos,
                                     sorted(tokenizer.get_vocab().items())]).encode()).hexdigest()[:16]
    cache = Path(cache_dir) / f"{p.name}.{split}.{key}.npz"
    if cache.is_file():
        with np.load(cache) as z:
            flat, lengths = z["flat"], z["lengths"]
        return np.split(flat, np.cumsum(lengths)[:-1])
    docs = tokenize_docs(tokenizer, read_texts(path, split), eos)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(cache.name + ".tmp.npz")
    np.savez(tmp, flat=np.concatenate(docs), lengths=np.asarray([len(d) for d in docs], np.int64))
    tmp.replace(cache)
    return docs
