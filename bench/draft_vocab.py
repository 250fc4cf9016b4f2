"""What a token map (--draft-vocab) costs in acceptance on real weights, by map size.

Maps of several sizes built from a corpus' train split; DDTree on its eval prompts, greedy.

    python -m bench draft-vocab --data CORPUS.jsonl.xz [--ckpt DIR] [--sizes 512,1024,2048,4096] [--budgets 16,64]

CORPUS is the full corpus with its train split (the shipped pair's: the Python 3.11.7 standard
library, `split` train / eval; the repository ships its eval prompts only).

For each map: the share of the eval split's tokens it covers, and per budget the mean acceptance
against the full vocabulary's (the tokens themselves must not change: checked). Writes
draft_vocab.json (and draft_vocab.png where matplotlib is installed) under --out.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench import prompts as bp
from ddtree_jax.errors import UserError, run_script
from ddtree_jax.token_map import most_frequent
from ddtree_jax.train.data import iter_texts


def corpus_ids(tok, path: Path, split: str, limit: int) -> list[list[int]]:
    """The token ids of the corpus' files of one split (the first `limit`; 0: all)."""
    texts = itertools.islice(iter_texts(path, split), limit or None)
    return [tok.encode(text, add_special_tokens=False) for text in texts]


def main(argv=None) -> int:
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.checkpoint import DEFAULT_CKPT
    from ddtree_jax.generator import Generator
    from ddtree_jax.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(prog="python -m bench draft-vocab", description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(DEFAULT_CKPT))
    ap.add_argument("--data", required=True, help="the corpus: JSONL[.xz] with train and eval splits")
    ap.add_argument("--sizes", default="512,1024,2048,4096")
    ap.add_argument("--budgets", default="16,64")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--train-docs", type=int, default=0, help="count the first N train files only (0: all)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x]
    budgets = [int(x) for x in args.budgets.split(",") if x]
    data = Path(args.data)
    if not data.is_file():
        raise UserError(f"corpus {data} not found; pass --data CORPUS.jsonl[.xz]")
    ck = load_checkpoint(args.ckpt, dtype=args.dtype)
    tok = load_tokenizer(ck)
    vocab = ck.target_cfg.vocab_size
    t0 = time.perf_counter()
    train = corpus_ids(tok, data, "train", args.train_docs)
    if not train:
        raise UserError(f"{data} has no train split to rank tokens by; pass the full corpus")
    held = corpus_ids(tok, data, "eval", 0)
    print(f"[draft_vocab] {sum(map(len, train))} train / {sum(map(len, held))} eval tokens "
          f"({time.perf_counter() - t0:.0f}s)", file=sys.stderr, flush=True)
    special = [t for t in tok.all_special_ids if 0 <= t < vocab]
    order = most_frequent(train, vocab, keep=special)
    eval_ids = np.concatenate([np.asarray(d, np.int64) for d in held if d])
    prompts = [list(p.ids) for p in bp.from_corpus(tok, data, args.prompts, args.prompt_tokens)]
    out = {"ckpt": str(args.ckpt), "vocab": vocab, "train_docs": len(train), "prompts": len(prompts),
           "max_new_tokens": args.max_new_tokens, "rows": []}
    for budget in budgets:
        full = Generator(ck, method="ddtree", budget=budget).generate_ids(prompts, max_new_tokens=args.max_new_tokens)
        base = float(np.mean([a for r in full for a in r.acceptance_lengths]))
        for size in sizes + [vocab]:
            ids = order[:size]
            if size == vocab:
                res, acc = full, base
            else:
                gen = Generator(ck, method="ddtree", budget=budget, draft_vocab=ids)
                res = gen.generate_ids(prompts, max_new_tokens=args.max_new_tokens)
                acc = float(np.mean([a for r in res for a in r.acceptance_lengths]))
            same = [r.token_ids for r in res] == [r.token_ids for r in full]
            if not same:
                raise AssertionError(f"map of {size}: the tokens changed (lossless broken)")
            cover = float(np.isin(eval_ids, np.asarray(ids)).mean())
            row = dict(budget=budget, size=size, eval_coverage=cover, mean_acceptance=acc,
                       relative=acc / base, tokens_equal=same)
            out["rows"].append(row)
            print(f"[draft_vocab] B={budget:4d} map {size:6d} of {vocab}: covers {100 * cover:5.1f} % of eval "
                  f"tokens, acceptance {acc:.3f} ({100 * acc / base:5.1f} % of the full vocabulary's)", flush=True)
    if args.out:
        path = Path(args.out)
        path.mkdir(parents=True, exist_ok=True)
        (path / "draft_vocab.json").write_text(json.dumps(out, indent=1))
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return 0
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        for budget in budgets:
            rows = [r for r in out["rows"] if r["budget"] == budget]
            ax.plot([r["size"] for r in rows], [r["mean_acceptance"] for r in rows], marker="o", label=f"DDTree-{budget}")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("token map size (tokens the drafter may propose)")
        ax.set_ylabel("mean acceptance (tokens / round)")
        name = "the shipped pair" if Path(args.ckpt) == Path(DEFAULT_CKPT) else Path(args.ckpt).name
        ax.set_title(f"Acceptance by token map size ({name}, greedy)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path / "draft_vocab.png", dpi=120)
    return 0


if __name__ == "__main__":
    run_script(main, prog="bench draft-vocab")
