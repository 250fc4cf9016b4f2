"""`python -m ddtree_jax.research record|replay|plot`: score tree policies offline, exactly.

    python -m ddtree_jax.research record --out rec.npz                  # the shipped pair, eval prompts
    python -m ddtree_jax.research replay rec.npz --tree-policy beam:width=8 --budget 16,64,256
    python -m ddtree_jax.research replay rec.npz --budget auto --cost-model cost.json --batch 8
    python -m ddtree_jax.research plot rec.npz --out acceptance.png    # every policy x budget

Every flag and file is checked before anything is loaded or computed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

from ddtree_jax.errors import ArgumentParser, UserError, run_script

PROG = "python -m ddtree_jax.research"
# The eval prompts the benchmarks read (bench/prompts.py), where the repository is at hand.
EVAL_PROMPTS = Path(__file__).resolve().parents[2] / "bench" / "data" / "eval_prompts.jsonl.xz"
PLOT_BUDGETS = "1,2,4,8,16,32,64,128,256"
# Budget of the DDTree decode that makes the greedy continuations (lossless: any budget gives them).
GREEDY_BUDGET = 16


def log(line: str) -> None:
    print(f"[research] {line}", file=sys.stderr, flush=True)


def build_parser() -> ArgumentParser:
    from ddtree_jax.checkpoint import DEFAULT_CKPT
    from ddtree_jax.trees import available_policies

    ap = ArgumentParser(prog=PROG, description=__doc__.splitlines()[0],
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="\n".join(__doc__.splitlines()[2:6]))
    sub = ap.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    defaults = argparse.ArgumentDefaultsHelpFormatter

    rec = sub.add_parser("record", formatter_class=defaults,
                         help="greedy continuations and the drafter's top-K log-probs at every root position")
    rec.add_argument("--out", required=True, help="the record file (.npz)")
    rec.add_argument("--ckpt", default=str(DEFAULT_CKPT), help="converted checkpoint with a drafter")
    src = rec.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="one prompt's text")
    src.add_argument("--prompt-file", help="one prompt per line (\\n escapes), or JSONL with 'prompt'/'text'")
    src.add_argument("--data", default=None,
                     help="a corpus (JSONL[.xz] with 'text' and 'split'): the first --prompt-tokens tokens of its "
                          f"eval documents (default: the shipped eval prompts, {EVAL_PROMPTS.name})")
    rec.add_argument("--num-prompts", type=int, default=32, help="prompts of the corpus or the prompt file")
    rec.add_argument("--prompt-tokens", type=int, default=256, help="corpus prompts' length in tokens")
    rec.add_argument("--max-new-tokens", type=int, default=256)
    rec.add_argument("--top-k", type=int, default=256,
                     help="tokens kept a depth; replay is exact up to budget K for ddtree (see replay --help)")
    rec.add_argument("--batch-size", type=int, default=8, help="prompts decoded together")
    rec.add_argument("--force", action="store_true", help="replace an existing --out")
    rec.add_argument("--debug", action="store_true", help="show tracebacks")

    pol_help = (f"a tree policy: {', '.join(available_policies())} (options as name:key=value,...); repeatable")
    rep = sub.add_parser("replay", formatter_class=defaults, help="a policy's greedy rounds over a record",
                         description="Needs top-K >= the ranks a policy reads: chain 1, ddtree the budget, "
                                     "beam:width=W min(W, budget), static its largest rank + 1.")
    rep.add_argument("record", help="a file of python -m ddtree_jax.research record")
    rep.add_argument("--tree-policy", action="append", default=None, help=pol_help + " (default: ddtree)")
    rep.add_argument("--budget", default="16,64,256",
                     help="draft nodes a round, comma-separated; auto: the engine's --budget auto (needs --cost-model)")
    rep.add_argument("--cost-model", help="--budget auto's cost model (a file of python -m bench fit-cost); its "
                                          "costs at --batch rows pick each round's tree")
    rep.add_argument("--auto-budgets", default=None,
                     help="DDTree budgets --budget auto chooses among, with DFlash where the cost model covers it "
                          "(default: the engine's, generate's --auto-budgets)")
    rep.add_argument("--batch", type=int, default=1,
                     help="prompts decoded together, as generate --batch-size: auto's one choice a round reads "
                          "their active rows")
    rep.add_argument("--max-new-tokens", type=int, default=None, help="at most the record's (default)")
    rep.add_argument("--ignore-eos", action="store_true", help="do not stop at the record's eos tokens")
    rep.add_argument("--ckpt", help="refuse the record unless it was made with this checkpoint")
    rep.add_argument("--json", action="store_true", help="one JSON object per policy and budget")
    rep.add_argument("--debug", action="store_true", help="show tracebacks")

    plot = sub.add_parser("plot", formatter_class=defaults, help="acceptance against budget, every policy")
    plot.add_argument("record", help="a file of python -m ddtree_jax.research record")
    plot.add_argument("--out", required=True, help="the PNG; the numbers go beside it as .csv and .json")
    plot.add_argument("--tree-policy", action="append", default=None,
                      help=pol_help + " (default: every registered policy that needs no option)")
    plot.add_argument("--budgets", default=PLOT_BUDGETS, help="budgets, comma-separated")
    plot.add_argument("--ignore-eos", action="store_true", help="do not stop at the record's eos tokens")
    plot.add_argument("--force", action="store_true", help="replace existing outputs")
    plot.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def parse_budgets(text: str, flag: str, auto: bool = False) -> list:
    """'16,64' -> [16, 64]; 'auto' passes through where `auto`."""
    from ddtree_jax import cost

    try:
        return cost.parse_budgets(text, auto=auto)
    except ValueError as e:
        raise UserError(f"{flag}: {e}") from None


def _policies(specs: Sequence[str] | None, default: Sequence[str]) -> list:
    from ddtree_jax.research.simulate import policy_for

    return [policy_for(s) for s in (specs or default)]


def _load(path: str, ckpt: str | None = None):
    from ddtree_jax.research.store import check_checkpoint, load_record

    rec = load_record(path)
    if ckpt is not None:
        if not Path(ckpt).is_dir():
            raise UserError(f"checkpoint {ckpt} not found; give the converted checkpoint the record was made with")
        check_checkpoint(rec, ckpt, path)
    return rec


# ----------------------------------------------------------------------------- record


def _record_prompts(args, tok) -> tuple[list[list[int]], list[str]]:
    import types

    from ddtree_jax.cli import _encode, _load_prompts

    if args.prompt is not None or args.prompt_file is not None:
        texts = _load_prompts(args)[:args.num_prompts]
        plain = types.SimpleNamespace(chat=False, system=None)
        name = "prompt" if args.prompt is not None else Path(args.prompt_file).name
        return [_encode(tok, t, plain) for t in texts], [f"{name}:{i + 1}" for i in range(len(texts))]
    data = Path(args.data) if args.data is not None else EVAL_PROMPTS
    if not data.is_file():
        raise UserError(f"corpus {data} not found; give --data CORPUS, --prompt-file FILE or --prompt TEXT")
    from ddtree_jax.train.data import eval_prompts

    found = eval_prompts(tok, data, args.num_prompts, args.prompt_tokens)
    return [ids for _, ids in found], [f"eval[{i}]" for i, _ in found]


def cmd_record(args) -> int:
    from ddtree_jax.checkpoint import read_meta, read_target_config, tokenizer_dir
    from ddtree_jax.cli import stop_ids_for
    from ddtree_jax.token_map import check_output
    from ddtree_jax.tokenizer import load_tokenizer

    for flag, value, low in (("--num-prompts", args.num_prompts, 1), ("--prompt-tokens", args.prompt_tokens, 1),
                             ("--max-new-tokens", args.max_new_tokens, 2), ("--top-k", args.top_k, 1),
                             ("--batch-size", args.batch_size, 1)):
        if value < low:
            raise UserError(f"{flag} must be >= {low} (got {value})")
    check_output(args.out, args.force)
    ckpt = Path(args.ckpt)
    tcfg = read_target_config(ckpt)
    drafter = read_meta(ckpt).get("drafter")
    if drafter is None:
        raise UserError(f"checkpoint {ckpt} has no drafter; convert one with python -m convert --draft")
    if args.top_k > tcfg.vocab_size:
        raise UserError(f"--top-k {args.top_k} exceeds the vocabulary ({tcfg.vocab_size} tokens)")
    if tokenizer_dir(ckpt) is None:
        raise UserError(f"checkpoint {ckpt} has no tokenizer; convert it with one (python -m convert ...)")
    tok = load_tokenizer(tokenizer_dir(ckpt))
    prompts, sources = _record_prompts(args, tok)
    if any(not p for p in prompts):
        raise UserError("a prompt encodes to no tokens; remove it")
    # the greedy decode: max_new_tokens + D tokens, and a round's tree and block (Generator._slack)
    slack = args.max_new_tokens + 2 * drafter["block_size"] + GREEDY_BUDGET
    longest = max(map(len, prompts))
    if longest + slack > tcfg.max_position:
        raise UserError(f"the longest prompt ({longest} tokens) plus --max-new-tokens {args.max_new_tokens} and "
                        f"{slack - args.max_new_tokens} positions of lookahead exceeds the model's context of "
                        f"{tcfg.max_position}; lower --max-new-tokens or --prompt-tokens")

    import jax

    from ddtree_jax import compile_cache
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.generator import Generator
    from ddtree_jax.research.record import make_header, record_greedy
    from ddtree_jax.research.store import save_record

    compile_cache.enable()
    dtype = "float32" if jax.default_backend() == "cpu" else None  # as generate: XLA:CPU emulates bf16
    gen = Generator(load_checkpoint(ckpt, dtype=dtype), method="ddtree", policy="ddtree", budget=GREEDY_BUDGET)
    log(f"{len(prompts)} prompts x {args.max_new_tokens} new tokens, top-{args.top_k} a depth")
    outputs, logp, ids = record_greedy(gen, prompts, args.max_new_tokens, args.top_k, batch_size=args.batch_size)
    header = make_header(ckpt_dir=ckpt.absolute(), gen=gen, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                         stop_ids=stop_ids_for(tok, tok.dir), sources=sources)
    out = save_record(args.out, header, prompts, outputs, logp, ids, force=args.force)
    log(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0


# ----------------------------------------------------------------------------- replay and plot


def _auto_budget(args):
    """--budget auto's BatchBudget from --cost-model and --auto-budgets (None without auto)."""
    from ddtree_jax.cost import load_cost_model
    from ddtree_jax.research.simulate import auto_budget

    if args.cost_model is None:
        raise UserError("--budget auto needs --cost-model FILE (python -m bench fit-cost writes one; "
                        "ddtree_jax/cost_models/ ships some)")
    budgets = None if args.auto_budgets is None else parse_budgets(args.auto_budgets, "--auto-budgets")
    return auto_budget(load_cost_model(args.cost_model), budgets)


def cmd_replay(args) -> int:
    budgets = parse_budgets(args.budget, "--budget", auto=True)
    if args.batch < 1:
        raise UserError(f"--batch must be >= 1 (got {args.batch})")
    auto = _auto_budget(args) if "auto" in budgets else None
    if auto is None and (args.cost_model is not None or args.auto_budgets is not None):
        raise UserError("--cost-model and --auto-budgets are --budget auto's; add auto to --budget or drop them")
    policies = _policies(args.tree_policy, ["ddtree"])
    rec = _load(args.record, args.ckpt)
    from ddtree_jax import compile_cache
    from ddtree_jax.research.record import progress
    from ddtree_jax.research.simulate import check_replayable, replay

    compile_cache.enable()  # a replay's trees compile for seconds: a second run of a policy loads them

    for policy in policies:
        for b in budgets:
            if b != "auto":
                check_replayable(rec, policy, b)
    n_new = args.max_new_tokens or rec.max_new_tokens
    with progress(rec.num_prompts * n_new * len(policies) * len(budgets), "replay", "token") as bar:
        results = [replay(rec, p, auto if b == "auto" else b, batch=args.batch, max_new_tokens=args.max_new_tokens,
                          stop=not args.ignore_eos, progress=bar)
                   for p in policies for b in budgets]
    sources = rec.header.get("sources") or [f"prompt {i + 1}" for i in range(rec.num_prompts)]
    for res in results:
        if args.json:
            print(json.dumps({"record": args.record, **res.to_json()}), flush=True)
            continue
        print(f"{res.policy} budget {res.budget}: mean acceptance {res.mean_acceptance:.3f} tokens a round, "
              f"{res.rounds} rounds, {res.mean_nodes:.1f} nodes a round")
        if res.choices:
            shares = "  ".join(f"{'DFlash' if c == 'dflash' else c}: {100 * s:.1f}%" for c, s in res.choices.items())
            ms = "" if res.mean_round_ms is None else f"; {res.mean_round_ms:.3f} modelled ms a round"
            print(f"  batch {res.batch}, rounds at each candidate: {shares}{ms}")
        for src, p in zip(sources, res.prompts):
            print(f"  {src:<16} {p.rounds:4d} rounds  {p.mean_acceptance:.3f}")
        print("  tokens a round: " + "  ".join(f"{n}: {c}" for n, c in enumerate(res.histogram, 1) if c))
    return 0


def cmd_plot(args) -> int:
    from ddtree_jax.research.plot import default_policies, write_plot

    budgets = parse_budgets(args.budgets, "--budgets")
    policies = _policies(args.tree_policy, default_policies())
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise UserError(f"--out {out} must name a .png file (the .csv and .json go beside it)")
    from ddtree_jax.token_map import check_output

    for path in (out, out.with_suffix(".csv"), out.with_suffix(".json")):
        check_output(path, args.force)
    rec = _load(args.record)
    from ddtree_jax import compile_cache

    compile_cache.enable()
    for line in write_plot(rec, policies, budgets, out, stop=not args.ignore_eos, title=Path(args.record).name,
                           force=args.force):
        log(line)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return {"record": cmd_record, "replay": cmd_replay, "plot": cmd_plot}[args.command](args)


if __name__ == "__main__":
    run_script(main, PROG)
