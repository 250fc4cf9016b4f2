"""A byte-level BPE tokenizer for source code, trained with the `tokenizers` library.

Byte-level means every string round-trips: no normalisation, no unknown token, whitespace and
indentation kept byte for byte (decode(encode(x)) == x). Two special tokens: `<|endoftext|>`
(end of document; also bos and pad) and `<|mask|>` (the DFlash drafter's mask token).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

from ddtree_jax.errors import UserError

EOS = "<|endoftext|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (EOS, MASK)


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train byte-level BPE on `texts`; returns a `transformers.PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    min_size = 256 + len(SPECIAL_TOKENS)
    if vocab_size < min_size:
        raise UserError(f"--vocab-size {vocab_size} is too small; byte-level BPE needs at least {min_size}")
    tok = Tokenizer(models.BPE())
    # GPT-2's split regex keeps runs of spaces (indentation) together and never merges across
    # them and words; add_prefix_space=False keeps the text exactly as given.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    seen = [0]

    def counted() -> Iterator[str]:
        for t in texts:
            seen[0] += 1
            yield t

    tok.train_from_iterator(counted(), trainer=trainer)
    if seen[0] == 0:
        raise UserError("no training text for the tokenizer; check --data and its split")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        mask_token=MASK,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 30,
    )


def save_tokenizer(tokenizer, out_dir: str | Path) -> None:
    """save_pretrained, naming the class every transformers version knows (4.x lacks 5.x's
    "TokenizersBackend")."""
    import json

    tokenizer.save_pretrained(str(out_dir))
    cfg_file = Path(out_dir) / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_file.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def load_tokenizer(path: str | Path):
    """Load a tokenizer saved by `save_tokenizer` (or any HF fast tokenizer with eos and a mask token)."""
    from transformers import PreTrainedTokenizerFast

    d = Path(path)
    if not (d / "tokenizer.json").is_file():
        raise UserError(f"tokenizer {d} not found (no tokenizer.json); train one with "
                        f"`python -m ddtree_jax.train tokenizer --data FILE --out DIR`")
    tok = PreTrainedTokenizerFast.from_pretrained(str(d))
    if tok.eos_token_id is None:
        raise UserError(f"tokenizer {d} has no eos token; train one with `python -m ddtree_jax.train tokenizer`")
    return tok


def mask_token_id(tokenizer) -> int:
    mid = tokenizer.convert_tokens_to_ids(MASK)
    if mid is None or mid == tokenizer.unk_token_id:
        mid = tokenizer.mask_token_id
    if mid is None:
        raise UserError(f"the tokenizer has no {MASK} token; train one with `python -m ddtree_jax.train tokenizer`")
    return int(mid)


def run_tokenizer_command(args) -> int:
    """`python -m ddtree_jax.train tokenizer`: train, check the round trip, save atomically."""
    import time

    from ddtree_jax.checkpoint import atomic_directory, check_writable
    from ddtree_jax.train.data import read_texts

    check_writable(args.out, args.force)
    texts = read_texts(args.data, None if args.split == "all" else args.split)
    t0 = time.time()
    tok = train_tokenizer(texts, args.vocab_size)
    sample = texts[0][:2000]
    if tok.decode(tok(sample, add_special_tokens=False)["input_ids"]) != sample:
        raise RuntimeError("the trained tokenizer does not round-trip its own training text")
    with atomic_directory(args.out, args.force) as tmp:
        save_tokenizer(tok, tmp)
    n_tokens = sum(len(x) for x in tok(texts[:50], add_special_tokens=False)["input_ids"])
    n_chars = sum(len(t) for t in texts[:50])
    print(f"tokenizer: vocab {len(tok)} ({', '.join(SPECIAL_TOKENS)} = ids "
          f"{tok.convert_tokens_to_ids(EOS)}, {tok.convert_tokens_to_ids(MASK)}), trained on {len(texts)} documents "
          f"in {time.time() - t0:.1f} s, {n_chars / max(n_tokens, 1):.2f} characters/token; saved to {args.out}")
    return 0
