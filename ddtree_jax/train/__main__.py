"""python -m ddtree_jax.train {tokenizer,target,drafter} ...: train the small demo pair.

    tokenizer --data FILE --vocab-size 8192 --out DIR
    target    --data FILE --tokenizer DIR --out DIR [--steps N] [--time-budget S] [--resume] ...
    drafter   --target HF_DIR --data FILE --out DIR [--steps N] [--time-budget S] [--resume] ...

A target/drafter OUT holds ckpt/ (the last good training state, for --resume), hf/ (the final
Hugging Face export) and metrics.json (loss curves). Every write is atomic.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from ddtree_jax.errors import ArgumentParser, run_script


def _int_list(s: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in s.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def _common_training(p: argparse.ArgumentParser, *, steps: int, batch: int, lr: float) -> None:
    g = p.add_argument_group("training")
    g.add_argument("--steps", type=int, default=steps, help="total optimizer steps (across resumes); default %(default)s")
    g.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="stop after S seconds of training in this invocation; the LR schedule is fitted to it")
    g.add_argument("--batch-size", type=int, default=batch, help="sequences per step; default %(default)s")
    g.add_argument("--seq-len", type=int, default=512, help="tokens per sequence; default %(default)s")
    g.add_argument("--lr", type=float, default=lr, help="peak learning rate; default %(default)s")
    g.add_argument("--min-lr-ratio", type=float, default=0.1, help="final LR as a fraction of the peak")
    g.add_argument("--warmup", type=int, default=100, help="linear warmup steps; default %(default)s")
    g.add_argument("--weight-decay", type=float, default=0.1)
    g.add_argument("--grad-clip", type=float, default=1.0)
    g.add_argument("--compute-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="dtype of the forward/backward math (params and optimizer stay float32)")
    g.add_argument("--export-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                   help="dtype of the exported Hugging Face weights")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--token-cache", default=None, metavar="DIR",
                   help="cache the tokenized corpus here (reused by later runs on the same data and tokenizer)")
    g = p.add_argument_group("bookkeeping")
    g.add_argument("--log-every", type=int, default=50)
    g.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations (0: only at the end)")
    g.add_argument("--eval-sequences", type=int, default=64, help="held-out sequences for periodic evals")
    g.add_argument("--final-eval-sequences", type=int, default=0, help="held-out sequences for the final eval (0: all)")
    g.add_argument("--ckpt-every", type=int, default=1000, help="steps between checkpoints in OUT/ckpt (0: none)")
    g.add_argument("--resume", action="store_true", help="continue from OUT/ckpt")
    g.add_argument("--force", action="store_true", help="start over in an OUT that already holds a run")
    g.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m ddtree_jax.train",
                            description="Train the small Qwen3 target, its DFlash drafter, and their tokenizer.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("tokenizer", help="train a byte-level BPE tokenizer")
    p.add_argument("--data", required=True, help="JSONL(.xz) with a 'text' field per line")
    p.add_argument("--split", default="train", help="only documents of this split ('all' for every one)")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--out", required=True, help="output directory (Hugging Face tokenizer files)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.add_argument("--debug", action="store_true")

    p = sub.add_parser("target", help="train a Qwen3 target from scratch")
    p.add_argument("--data", required=True, help="JSONL(.xz) with 'text' (and optional 'split') per line")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory (from the tokenizer command)")
    p.add_argument("--out", required=True)
    g = p.add_argument_group("model size")
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--hidden", type=int, default=256)
    g.add_argument("--heads", type=int, default=4)
    g.add_argument("--kv-heads", type=int, default=2)
    g.add_argument("--head-dim", type=int, default=64)
    g.add_argument("--intermediate", type=int, default=512)
    g.add_argument("--max-position", type=int, default=2048)
    g.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--keep-best", action=argparse.BooleanOptionalAction, default=True,
                   help="export the params of the best periodic held-out eval when they beat the last ones")
    _common_training(p, steps=20000, batch=64, lr=2e-3)

    p = sub.add_parser("drafter", help="train a DFlash drafter against a frozen target")
    p.add_argument("--target", required=True, help="the target's Hugging Face directory (e.g. OUT/hf of the target command)")
    p.add_argument("--data", required=True)
    p.add_argument("--tokenizer", default=None, help="tokenizer directory; default: the --target directory")
    p.add_argument("--out", required=True)
    g = p.add_argument_group("drafter shape")
    g.add_argument("--layers", type=int, default=2)
    g.add_argument("--intermediate", type=int, default=None, help="default: the target's")
    g.add_argument("--heads", type=int, default=None, help="default: the target's")
    g.add_argument("--kv-heads", type=int, default=None, help="default: the target's")
    g.add_argument("--head-dim", type=int, default=None, help="default: the target's")
    g.add_argument("--block-size", type=int, default=16)
    g.add_argument("--target-layer-ids", type=_int_list, default=None, metavar="I,J",
                   help="tapped target layers; default: 1 and L-2")
    g = p.add_argument_group("DFlash objective")
    g.add_argument("--anchors", type=int, default=32, help="blocks (anchor positions) per training sequence")
    g.add_argument("--gamma", type=float, default=7.0, help="loss weight of block position k: exp(-(k-1)/gamma)")
    g.add_argument("--labels", choices=("distill", "data"), default="distill",
                   help="distill: cross-entropy to the target's distribution; data: the data's next tokens")
    g.add_argument("--eval-anchors", type=int, default=8, help="held-out anchors per eval sequence")
    _common_training(p, steps=20000, batch=64, lr=2e-3)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "tokenizer":
        from ddtree_jax.train.tokenizer import run_tokenizer_command

        return run_tokenizer_command(args)
    if args.command == "target":
        from ddtree_jax.train.target import run_target_command

        return run_target_command(args)
    from ddtree_jax.train.drafter import run_drafter_command

    return run_drafter_command(args)


if __name__ == "__main__":
    run_script(main, prog="ddtree_jax.train")
