"""The command line: `python -m ddtree_jax.generate` (flags -> a `Generator`, prompts -> text).

    python -m ddtree_jax.generate --prompt "def fib(n):"            # the shipped pair, DDTree
    python -m ddtree_jax.generate --ckpt DIR --method ar --prompt "..." --json

Every flag is checked here, before anything is loaded.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

import jax

from ddtree_jax import compile_cache
from ddtree_jax.checkpoint import DEFAULT_CKPT
from ddtree_jax.errors import ArgumentParser, UserError, json_line_text, read_text_file
from ddtree_jax.generator import DRAFTER_QUANTS, METHODS, STREAM_MAX_ROUNDS_PER_CALL, Generator
from ddtree_jax.token_map import check_token_map, read_token_map


def _load_prompts(args) -> list[str]:
    if args.prompt is not None:
        prompts = [args.prompt]
    elif args.prompt_file is not None:
        path = Path(args.prompt_file)
        text = read_text_file(path, "prompt file")
        prompts = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                prompts.append(json_line_text(line, f"{path}:{n}"))
            else:
                prompts.append(line.replace("\\n", "\n"))
        if not prompts:
            raise UserError(f"prompt file {path} has no prompts")
    else:
        raise UserError("give --prompt TEXT or --prompt-file FILE")
    if any(not p for p in prompts):
        raise UserError("a prompt is empty; give at least one character of text")
    return prompts


def build_parser() -> ArgumentParser:
    from ddtree_jax.trees import available_policies

    ap = ArgumentParser(prog="python -m ddtree_jax.generate",
                                 description="Lossless speculative generation with DDTree / DFlash, or plain decoding.")
    ap.add_argument("--ckpt", default=str(DEFAULT_CKPT),
                    help="converted checkpoint directory (python -m convert); default: the shipped small pair")
    ap.add_argument("--method", default="ddtree", choices=METHODS)
    ap.add_argument("--tree-policy", default="ddtree",
                    help=f"tree policy for --method ddtree: {', '.join(available_policies())} "
                         "(options as name:key=value,...)")
    ap.add_argument("--budget", type=int, default=64, help="draft nodes verified per round (ddtree)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompt")
    src.add_argument("--prompt-file", help="one prompt per line (\\n escapes allowed), or JSONL with 'prompt'/'text'")
    ap.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    ap.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming text")
    ap.add_argument("--profile", action="store_true", help="time each stage of the round (slower: a sync per stage)")
    ap.add_argument("--attn-impl", default="auto", help="attention implementation: auto, xla, pallas, ...")
    ap.add_argument("--matmul-impl", default="auto", choices=("auto", "xla", "pallas", "pallas_interpret"),
                    help="projection / LM-head matmuls: auto, xla, pallas (the skinny-matmul kernel where it fits)")
    ap.add_argument("--drafter-quant", default="none", choices=DRAFTER_QUANTS,
                    help="int8: the drafter's weights and its copy of the LM head as int8 (fewer bytes a "
                         "draft; lossless, acceptance may change a little)")
    ap.add_argument("--draft-vocab", metavar="FILE",
                    help="token map: the drafter drafts over these ids only (a JSON list; build one with "
                         "python -m ddtree_jax.token_map); fewer bytes a draft, lossless, acceptance may drop a little")
    ap.add_argument("--cache-impl", default="auto", choices=("auto", "xla", "pallas", "pallas_interpret"),
                    help="the commit's KV-cache writes: auto (= xla for now), xla, pallas (all layers in one kernel)")
    ap.add_argument("--rounds-per-call", type=int, default=4,
                    help="rounds of the first device call while streaming; later calls double it, up to "
                         f"{STREAM_MAX_ROUNDS_PER_CALL}")
    ap.add_argument("--unroll", type=int, default=0,
                    help="rounds per device-loop iteration (0: the device's default)")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32", "float16"),
                    help="compute dtype; auto: the checkpoint's on accelerators, float32 on the CPU")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def load_tokenizer(ckpt):
    if ckpt.tokenizer_dir is None:
        raise UserError("the checkpoint has no tokenizer files; reconvert with a target directory that has them")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(ckpt.tokenizer_dir))
    except Exception as e:  # noqa: BLE001 - transformers raises many types here
        raise UserError(f"cannot load the tokenizer from {ckpt.tokenizer_dir}: {e}".splitlines()[0]) from None


def stop_ids_for(tokenizer, tokenizer_dir) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = Path(tokenizer_dir) / "generation_config.json" if tokenizer_dir else None
    if gen is not None and gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        for e in eos if isinstance(eos, list) else [eos]:
            if e is not None:
                ids.add(int(e))
    return sorted(ids)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.trees import make_policy

    # Cheap checks first: nothing is loaded before the options and prompts are known to be good.
    if args.budget < 0:
        raise UserError(f"--budget must be >= 0 (got {args.budget})")
    if args.temperature < 0:
        raise UserError(f"--temperature must be >= 0 (got {args.temperature}); 0 means greedy")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1] (got {args.top_p})")
    if args.rounds_per_call < 1:
        raise UserError(f"--rounds-per-call must be >= 1 (got {args.rounds_per_call})")
    if args.unroll < 0:
        raise UserError(f"--unroll must be >= 0 (got {args.unroll}); 0 picks the device's default")
    if args.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (got {args.top_k}); 0 means off")
    try:
        make_policy(args.tree_policy)
        from ddtree_jax.kernels import check_tuned_tables

        check_tuned_tables()  # a bad $DDTREE_*_TABLE now, not after loading the model
    except ValueError as e:
        raise UserError(str(e)) from None
    prompts = _load_prompts(args)
    ckpt_path = Path(args.ckpt)
    if not ckpt_path.exists():
        hint = " (the shipped model is missing: reinstall the package)" if ckpt_path == DEFAULT_CKPT else ""
        raise UserError(f"checkpoint {ckpt_path} not found{hint}; convert one with python -m convert")
    draft_vocab = None
    if args.draft_vocab is not None:
        if args.method == "ar":
            raise UserError("--draft-vocab needs a drafter (method dflash or ddtree)")
        from ddtree_jax.checkpoint import read_target_config

        draft_vocab = read_token_map(args.draft_vocab)
        check_token_map(draft_vocab, read_target_config(ckpt_path).vocab_size, where=f"token map {args.draft_vocab}")
    dtype = args.dtype
    if dtype == "auto":  # XLA:CPU emulates bf16 matmuls; float32 is faster there
        dtype = "float32" if jax.default_backend() == "cpu" else None
    compile_cache.enable()  # a second run with the same shapes skips compilation
    ckpt = load_checkpoint(ckpt_path, with_drafter=args.method != "ar", dtype=dtype)
    gen = Generator(ckpt, method=args.method, policy=args.tree_policy, budget=args.budget, attn_impl=args.attn_impl,
                    matmul_impl=args.matmul_impl, cache_impl=args.cache_impl, drafter_quant=args.drafter_quant,
                    draft_vocab=draft_vocab, unroll=args.unroll,
                    log=lambda line: print(line, file=sys.stderr, flush=True))
    tok = load_tokenizer(ckpt)
    stop = stop_ids_for(tok, ckpt.tokenizer_dir)
    encoded = []
    for p in prompts:
        if args.chat:
            if not getattr(tok, "chat_template", None):
                raise UserError("the tokenizer has no chat template; drop --chat")
            p = tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        encoded.append(tok.encode(p, add_special_tokens=False))
    for ids in encoded:
        gen.check_request([len(ids)], args.max_new_tokens, args.temperature, args.top_p)

    for prompt, ids in zip(prompts, encoded):
        streamer = None if args.json else _TextStream(tok)
        res = gen.generate_ids([ids], max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                               top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop_ids=stop,
                               on_tokens=streamer, rounds_per_call=args.rounds_per_call if streamer else 0,
                               profile=args.profile)[0]
        text = tok.decode(res.token_ids, skip_special_tokens=True)
        if args.json:
            obj = {"prompt": prompt, "text": text, "method": args.method, "tree_policy": gen.policy_name,
                   "budget": gen.budget, **res.to_json()}
            if not args.profile:
                obj.pop("stage_ms")
            print(json.dumps(obj), flush=True)
        else:
            streamer.finish()
            stats = (f"[{res.num_output_tokens} tokens in {res.time_s:.2f}s, {res.tokens_per_s:.1f} tok/s, "
                     f"{res.rounds} rounds, mean acceptance {res.mean_acceptance:.2f}]")
            if res.stage_ms:
                stats += " stage ms/round: " + ", ".join(f"{k} {v:.2f}" for k, v in res.stage_ms.items())
            print(stats, file=sys.stderr, flush=True)
    return 0


class _TextStream:
    """Prints decoded text as tokens arrive; holds back incomplete UTF-8 at the end."""

    def __init__(self, tok):
        self.tok, self.ids, self.printed = tok, [], 0

    def __call__(self, row: int, new_ids: list[int]):
        self.ids.extend(new_ids)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        stable = len(text.rstrip("\ufffd"))
        if stable > self.printed:
            sys.stdout.write(text[self.printed: stable])
            sys.stdout.flush()
            self.printed = stable

    def finish(self):
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        sys.stdout.write(text[self.printed:] + "\n")
        sys.stdout.flush()
