"""The command line: `python -m ddtree_jax.generate` (flags -> a `Generator`, prompts -> text).

    python -m ddtree_jax.generate --prompt "def fib(n):"            # the shipped pair, DDTree
    python -m ddtree_jax.generate --ckpt DIR --method ar --prompt-file prompts.jsonl --json
    echo "hello" | python -m ddtree_jax.generate --prompt - --chat --system "Be brief."

Every flag is checked here, before anything is loaded.
"""
from __future__ import annotations

import os
import time


def _process_age() -> float:
    """Seconds since this process started (Linux; 0 elsewhere): the package's imports, jax's
    among them, run before this module's, and a cold start counts them."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


STARTED = time.perf_counter() - _process_age()  # the cold start's clock

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Sequence  # noqa: E402

from ddtree_jax.checkpoint import DEFAULT_CKPT, has_drafter, is_hf_model, read_target_config  # noqa: E402
from ddtree_jax.errors import ArgumentParser, UserError, json_line_text, read_text_file  # noqa: E402
from ddtree_jax.cost import load_cost_model  # noqa: E402
from ddtree_jax.generator import AUTO_BUDGETS, DRAFTER_QUANTS, METHODS, STREAM_MAX_ROUNDS_PER_CALL, check_budget_fits  # noqa: E402
from ddtree_jax.generator import check_deterministic  # noqa: E402
from ddtree_jax.token_map import check_token_map, read_token_map  # noqa: E402
from ddtree_jax.tokenizer import load_tokenizer  # noqa: E402

PROG = "python -m ddtree_jax.generate"


def log(line: str) -> None:
    print(f"[ddtree] {line}", file=sys.stderr, flush=True)


def progress(line: str) -> None:
    """What the first seconds are spent on, where a person watches (stderr is a terminal)."""
    if sys.stderr.isatty():
        log(line)


def _stdin_text() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        raise UserError("'-' reads the prompt from standard input, and none is piped in; pipe text or give it")
    return sys.stdin.read()


def _load_prompts(args) -> list[str]:
    if args.prompt is not None:
        prompts = [_stdin_text().rstrip("\n") if args.prompt == "-" else args.prompt]
    elif args.prompt_file is not None:
        stdin = args.prompt_file == "-"
        path = Path("<stdin>" if stdin else args.prompt_file)
        text = _stdin_text() if stdin else read_text_file(path, "prompt file")
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
        raise UserError("give --prompt TEXT or --prompt-file FILE ('-' reads standard input)")
    if any(not p for p in prompts):
        raise UserError("a prompt is empty; give at least one character of text")
    return prompts


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ddtree-jax")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> ArgumentParser:
    from ddtree_jax.trees import available_policies

    ap = ArgumentParser(prog=PROG, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                        description="Lossless speculative generation with DDTree / DFlash, or plain decoding.")
    ap.add_argument("--version", action="version", version=f"ddtree-jax {_version()}")
    ap.add_argument("--ckpt", default=str(DEFAULT_CKPT),
                    help="converted checkpoint directory (python -m convert), or a Hugging Face target directory")
    ap.add_argument("--target", metavar="HF_DIR",
                    help="a Hugging Face target directory, read without converting (its tokenizer is used); "
                         "instead of --ckpt")
    ap.add_argument("--draft", metavar="HF_DIR", help="a z-lab DFlash drafter directory for --target")
    ap.add_argument("--method", default="ddtree", choices=METHODS,
                    help="ar: plain decoding; dflash: the drafter's top-1 chain; ddtree: a tree of --budget nodes")
    ap.add_argument("--tree-policy", default="ddtree",
                    help=f"tree policy for --method ddtree: {', '.join(available_policies())} "
                         "(options as name:key=value,...)")
    ap.add_argument("--budget", type=_budget, default=64,
                    help="draft nodes verified per round (ddtree), or auto: each round the candidate size with the "
                         "most expected tokens a millisecond by the device's cost model (--cost-model)")
    ap.add_argument("--cost-model", metavar="FILE", default=None,
                    help="--budget auto's round costs (python -m bench fit-cost); default: the one shipped for "
                         "this GPU and model shape")
    ap.add_argument("--auto-budgets", type=_budget_list, default=AUTO_BUDGETS, metavar="B,B,...",
                    help="the tree sizes --budget auto chooses among (with the chain), where its cost model covers "
                         f"them; default {','.join(map(str, AUTO_BUDGETS))}: each round builds the largest")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling's mass")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (any integer)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--prompt", help="the prompt text; '-' reads it from standard input")
    src.add_argument("--prompt-file", help="one prompt per line (\\n escapes allowed), or JSONL with 'prompt'/'text'; "
                                           "'-' reads standard input")
    ap.add_argument("--batch-size", type=int, default=8, help="prompts of a prompt file decoded together")
    ap.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    ap.add_argument("--interactive", "-i", action="store_true",
                    help="chat turn by turn on standard input (the conversation stays in the device's cache; "
                         "/reset starts over, an empty line or EOF ends)")
    ap.add_argument("--system", help="a system message (implies --chat)")
    ap.add_argument("--stop", action="append", default=[], metavar="TEXT",
                    help="stop a prompt's output at this text (repeatable; the text is left out)")
    ap.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens tokens whatever comes")
    ap.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of streaming text")
    ap.add_argument("--profile", action="store_true",
                    help="time each stage of the round (each stage its own call and a sync: a slower run)")
    ap.add_argument("--attn-impl", default="auto", help="attention implementation: auto, xla, pallas, ...")
    ap.add_argument("--matmul-impl", default="auto", choices=("auto", "xla", "pallas", "pallas_interpret"),
                    help="projection / LM-head matmuls (pallas: the skinny-matmul kernel where it fits)")
    ap.add_argument("--cache-impl", default="auto", choices=("auto", "xla", "pallas", "pallas_interpret"),
                    help="the commit's KV-cache writes (pallas: all layers in one kernel)")
    ap.add_argument("--drafter-quant", default="none", choices=DRAFTER_QUANTS,
                    help="int8: the drafter's weights and its copy of the LM head as int8 (fewer bytes a "
                         "draft; lossless, acceptance may change a little)")
    ap.add_argument("--draft-vocab", metavar="FILE",
                    help="token map: the drafter drafts over these ids only (a JSON list; build one with "
                         "python -m ddtree_jax.token_map); fewer bytes a draft, lossless, acceptance may drop a little")
    ap.add_argument("--rounds-per-call", type=int, default=4,
                    help="rounds of the first device call while streaming; later calls double it, up to "
                         f"{STREAM_MAX_ROUNDS_PER_CALL}")
    ap.add_argument("--unroll", type=int, default=0, help="rounds per device-loop iteration (0: the device's default)")
    ap.add_argument("--tp", type=_tp, default=1, metavar="N|auto",
                    help="shard the model over N devices of this host (attention by heads, MLP by width, MoE "
                         "experts across devices; every call on XLA's kernels); auto: the fewest whose memory "
                         "holds the weights")
    ap.add_argument("--deterministic", action="store_true",
                    help="every verify row computes bit for bit what a one-token step does (fixed-tile Pallas "
                         "kernels): the same greedy tokens under every method and budget in bf16 too; slower")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32", "float16"),
                    help="compute dtype; auto: the checkpoint's on accelerators, float32 on the CPU")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def _budget(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of draft nodes or auto, got {text!r}") from None


def _budget_list(text: str) -> tuple[int, ...]:
    from ddtree_jax.cost import parse_budgets

    try:
        return tuple(parse_budgets(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _tp(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of devices or auto, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a number of devices >= 1, got {n}")
    return n


def _given(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def check_flags(args, argv: Sequence[str]) -> None:
    """The cheap checks, before anything is loaded; a warning for each flag that has no effect."""
    if args.budget != "auto" and args.budget < 0:
        raise UserError(f"--budget must be >= 0 (got {args.budget})")
    if args.budget == "auto" and args.method != "ddtree":
        raise UserError(f"--budget auto sizes DDTree's tree; use it with --method ddtree, not {args.method}")
    if args.temperature < 0 or args.temperature != args.temperature:
        raise UserError(f"--temperature must be >= 0 (got {args.temperature}); 0 means greedy")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1] (got {args.top_p})")
    if args.top_k < 0:
        raise UserError(f"--top-k must be >= 0 (got {args.top_k}); 0 means off")
    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1 (got {args.max_new_tokens})")
    if args.rounds_per_call < 1:
        raise UserError(f"--rounds-per-call must be >= 1 (got {args.rounds_per_call})")
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1 (got {args.batch_size})")
    if args.unroll < 0:
        raise UserError(f"--unroll must be >= 0 (got {args.unroll}); 0 picks the device's default")
    if any(not s for s in args.stop):
        raise UserError("--stop needs a non-empty text")
    if args.deterministic:
        check_deterministic(args.attn_impl, args.matmul_impl, args.tp)
    from ddtree_jax.trees import make_policy

    try:
        make_policy(args.tree_policy)
    except ValueError as e:
        raise UserError(str(e)) from None
    unused = []
    if args.method != "ddtree":
        unused += [(f, f"with --method {args.method}") for f in ("--budget", "--tree-policy", "--cost-model",
                                                                   "--auto-budgets")]
    elif args.budget != "auto":
        unused += [(f, "without --budget auto") for f in ("--cost-model", "--auto-budgets")]
    if args.temperature == 0:
        unused += [(f, "at --temperature 0 (greedy)") for f in ("--top-k", "--top-p", "--seed")]
    if args.prompt is not None:
        unused.append(("--batch-size", "with a single --prompt"))
    for flag, why in unused:
        if _given(argv, flag):
            log(f"warning: {flag} has no effect {why}")
    if args.profile:
        log("--profile runs each stage of a round as its own call with a sync after it: slower than a plain run")


def stop_ids_for(tokenizer, tokenizer_dir) -> list[int]:
    """The tokenizer's eos id and generation_config.json's eos_token_id (an id or a list of ids);
    a generation_config.json that is not JSON, or an eos_token_id that is not ids, is one UserError line."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = Path(tokenizer_dir) / "generation_config.json" if tokenizer_dir else None
    if gen is not None and gen.is_file():
        fix = "fix it, or delete it to stop at the tokenizer's eos token only"
        try:
            config = json.loads(gen.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            why = f"{e.msg} at line {e.lineno}" if isinstance(e, json.JSONDecodeError) else type(e).__name__
            raise UserError(f"{gen} is not valid JSON ({why}); {fix}") from None
        if not isinstance(config, dict):
            raise UserError(f"{gen} holds {type(config).__name__}, not a JSON object; {fix}")
        eos = config.get("eos_token_id")
        for e in eos if isinstance(eos, list) else [eos]:
            if e is not None and (isinstance(e, bool) or not isinstance(e, int) or not 0 <= e < 2**31):
                raise UserError(f"{gen}: eos_token_id is {json.dumps(eos)[:40]}; it must be a token id (an integer "
                                f">= 0) or a list of them; {fix}")
            if e is not None:
                ids.add(e)
    return sorted(ids)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_flags(args, argv)
    if args.interactive and (args.prompt is not None or args.prompt_file is not None or args.json):
        raise UserError("--interactive reads its turns from standard input; drop --prompt / --prompt-file / --json")
    prompts = [] if args.interactive else _load_prompts(args)
    if args.target is not None:
        if _given(argv, "--ckpt"):
            raise UserError("--ckpt and --target both name the model; give one of them")
        from ddtree_jax.checkpoint import hf

        ckpt_path = Path(args.target)
        target_cfg = hf.HFModel(ckpt_path, "--target", "target").cfg
        drafter, get_one = args.draft is not None, "pass its drafter with --draft HF_DIR"
    else:
        if args.draft is not None:
            raise UserError("--draft HF_DIR goes with --target HF_DIR; a converted --ckpt brings its own drafter")
        ckpt_path = Path(args.ckpt)
        if not ckpt_path.exists():
            hint = " (the shipped model is missing: reinstall the package)" if ckpt_path == DEFAULT_CKPT else ""
            raise UserError(f"checkpoint {ckpt_path} not found{hint}; convert one with python -m convert")
        target_cfg = read_target_config(ckpt_path)
        drafter = has_drafter(ckpt_path)
        get_one = ("name it and its drafter with --target HF_DIR --draft HF_DIR (or convert them: python -m convert)"
                   if is_hf_model(ckpt_path)
                   else "convert one with python -m convert --draft")
    if args.method != "ar" and not drafter:
        raise UserError(f"method {args.method} needs a drafter, and this checkpoint has none; {get_one}, "
                        "or use --method ar")
    if args.method == "ddtree":
        check_budget_fits(max(args.auto_budgets) if args.budget == "auto" else args.budget, target_cfg.max_position)
    if args.budget == "auto" and args.cost_model is not None:  # its device and model are checked once loaded
        load_cost_model(args.cost_model)
    draft_vocab = None
    if args.draft_vocab is not None:
        if args.method == "ar":
            raise UserError("--draft-vocab needs a drafter (method dflash or ddtree)")
        draft_vocab = read_token_map(args.draft_vocab)
        check_token_map(draft_vocab, target_cfg.vocab_size, where=f"token map {args.draft_vocab}")

    progress(f"loading {ckpt_path} ...")
    t0 = time.perf_counter()
    import jax

    from ddtree_jax import compile_cache, sharding
    from ddtree_jax.checkpoint import load_checkpoint, load_hf
    from ddtree_jax.generator import Generator

    if args.tp != "auto":  # the devices and the target's shapes; the drafter's before its weights are read
        sharding.check_tp(args.tp, target_cfg, None, len(jax.devices()))

    dtype = args.dtype
    if dtype == "auto":  # XLA:CPU emulates bf16 matmuls; float32 is faster there
        dtype = "float32" if jax.default_backend() == "cpu" else None
    # lazy: every name and shape is checked now, the weights are read one tensor at a time as
    # the Generator puts them on the device
    if args.target is not None:
        ckpt = load_hf(ckpt_path, args.draft if args.method != "ar" else None, dtype=dtype, lazy=True)
    else:
        ckpt = load_checkpoint(ckpt_path, with_drafter=args.method != "ar", dtype=dtype, lazy=True)
    tok = load_tokenizer(ckpt.tokenizer_dir)
    stop_ids = [] if args.ignore_eos else stop_ids_for(tok, tok.dir)
    encoded = [_encode(tok, p, args) for p in prompts]
    compile_cache.enable()  # a second run with the same shapes skips compilation
    gen = Generator(ckpt, method=args.method, policy=args.tree_policy, budget=args.budget, attn_impl=args.attn_impl,
                    matmul_impl=args.matmul_impl, cache_impl=args.cache_impl, drafter_quant=args.drafter_quant,
                    draft_vocab=draft_vocab, unroll=args.unroll, cost_model=args.cost_model, tp=args.tp,
                    auto_budgets=args.auto_budgets, deterministic=args.deterministic,
                    log=lambda line: print(line, file=sys.stderr, flush=True))
    load_s = time.perf_counter() - t0
    for ids in encoded:
        gen.check_request([len(ids)], args.max_new_tokens, args.temperature, args.top_p)
    progress(f"loaded in {load_s:.1f}s")
    if args.interactive:
        return interactive(args, gen, tok, stop_ids, sys.stdin, sys.stdout)

    many = len(prompts) > 1
    first_token: list[float] = []  # seconds from the start to the first token out

    def arrived(r: int, ids: list[int]) -> bool:
        if not first_token:
            first_token.append(time.perf_counter() - STARTED)
        return cuts[r].add(ids)

    for start in range(0, len(prompts), args.batch_size):
        rows = list(range(start, min(start + args.batch_size, len(prompts))))
        stream = not args.json and len(rows) == 1
        cuts = [_StopCut(tok, args.stop, out=_Printer() if stream else None) for _ in rows]
        watch = stream or bool(args.stop)  # tokens come back between device calls
        compiled_before = gen.compile_s
        results = gen.generate_ids([encoded[i] for i in rows], max_new_tokens=args.max_new_tokens,
                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                   seed=args.seed + start, stop_ids=stop_ids,
                                   on_tokens=arrived if watch else None,
                                   rounds_per_call=args.rounds_per_call if watch else 0, profile=args.profile)
        cold = {"compile": gen.compile_s - compiled_before}
        if start == 0:
            if not first_token:  # not streamed: the tokens came out with the results
                first_token.append(time.perf_counter() - STARTED)
            cold = {"load": load_s, **cold, "first token": first_token[0]}
        for r, (i, res) in enumerate(zip(rows, results)):
            cut = cuts[r]
            if not watch:
                cut.add(res.token_ids)
            ids = cut.kept_ids(res.token_ids)
            if args.json:
                obj = {"prompt": prompts[i], "text": cut.text(), "method": args.method,
                       "tree_policy": gen.policy_name, "budget": "auto" if gen.auto else gen.budget,
                       **dict(res.to_json(), token_ids=ids, num_output_tokens=len(ids))}
                if not args.profile:
                    obj.pop("stage_ms")
                print(json.dumps(obj), flush=True)
                continue
            if many:
                print(f"==> prompt {i + 1} of {len(prompts)} <==", flush=True)
            if stream:
                cut.finish()
            else:
                print(cut.text(), flush=True)
        log(stats_line(results, jax.devices()[0], cold))
    return 0


# Positions a conversation's cache holds (the model's context where smaller): its memory is taken
# once, at the first turn, so that later turns append to it in place.
CONVERSATION_POSITIONS = 8192


def interactive(args, gen, tok, stop_ids, inp, out) -> int:
    """Chat turn by turn: each turn's prompt is the chat template over the whole conversation,
    of which only what the device's cache does not hold yet is prefilled."""
    import jax

    from ddtree_jax.models.family import family_of

    if tok.chat_template is None:
        raise UserError("--interactive needs a tokenizer with a chat template; this checkpoint's has none")
    context = min(gen.tcfg.max_position, CONVERSATION_POSITIONS)
    # a recurrent (hybrid) target cannot restart inside its cache: each turn prefills it all
    continues = family_of(gen.tcfg).continues
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages, consumed = list(system), []
    tty = hasattr(inp, "isatty") and inp.isatty()
    while True:
        if tty:
            print(">>> ", end="", file=sys.stderr, flush=True)
        line = inp.readline()
        text = line.rstrip("\n")
        if not text.strip():
            return 0
        if text.strip() == "/reset":
            messages, consumed = list(system), []
            continue
        messages.append({"role": "user", "content": text})
        ids = tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
        same = next((i for i, (a, b) in enumerate(zip(ids, consumed)) if a != b), min(len(ids), len(consumed)))
        start = min(same, len(consumed) - 1, len(ids) - 1) if consumed and continues else None
        cut = _StopCut(tok, args.stop, out=out.write)
        try:
            res = gen.generate_ids([ids if start is None else ids[start:]], max_new_tokens=args.max_new_tokens,
                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                   seed=args.seed + len(messages), stop_ids=stop_ids, min_cache=context,
                                   start=start, on_tokens=lambda r, new: cut.add(new),
                                   rounds_per_call=args.rounds_per_call)[0]
        except UserError as e:
            if "no longer fits" not in str(e):
                raise
            log(f"{e}: the conversation starts over")
            messages, consumed = list(system) + [messages[-1]], []
            continue
        cut.finish()
        out.flush()
        consumed = ids + cut.kept_ids(res.token_ids)
        messages.append({"role": "assistant", "content": cut.text()})
        log(stats_line([res], jax.devices()[0]))


def _encode(tok, prompt: str, args) -> list[int]:
    """Prompt ids as `transformers` makes them: the tokenizer's own special tokens (a Llama-3 BOS)
    for plain text; a chat template writes its own."""
    if args.chat or args.system is not None:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else []) + [
            {"role": "user", "content": prompt}]
        return tok.encode(tok.apply_chat_template(messages, add_generation_prompt=True), add_special_tokens=False)
    return tok.encode(prompt, add_special_tokens=True)


def stats_line(results, device, cold: dict[str, float] | None = None) -> str:
    """One closing line a batch: prompt and generated tokens with their rates, rounds, memory, and
    `cold`'s seconds (the first batch: loading, compiling, the first token from the command's start)."""
    prompt = sum(r.prompt_tokens for r in results)
    new = sum(r.num_output_tokens for r in results)
    prefill = max(r.prefill_s for r in results)
    decode = max(r.time_s - r.prefill_s for r in results)
    rounds = [a for r in results for a in r.acceptance_lengths]
    parts = [f"prompt: {prompt} tokens, {prompt / prefill if prefill > 0 else 0:.1f} tokens/s",
             f"generation: {new} tokens, {new / decode if decode > 0 else 0:.1f} tokens/s",
             f"{max(r.rounds for r in results)} rounds, mean acceptance {sum(rounds) / max(len(rounds), 1):.2f}"]
    peak = (device.memory_stats() or {}).get("peak_bytes_in_use")
    if peak:
        parts.append(f"peak memory {peak / 2**30:.2f} GiB")
    if cold:
        parts.append(", ".join(f"{k} {v:.1f} s" for k, v in cold.items()))
    line = " | ".join(parts)
    stage_ms = results[0].stage_ms
    if stage_ms:
        line += " | stage ms/round: " + ", ".join(f"{k} {v:.2f}" for k, v in stage_ms.items())
    return line


class _Printer:
    """Writes text to stdout as it becomes final."""

    def __call__(self, text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()


class _StopCut:
    """One prompt's output: decoded as tokens arrive, cut before the first stop string; prints
    the part that can no longer change (incomplete UTF-8 and a possible stop's start held back)."""

    def __init__(self, tok, stops: Sequence[str], out=None):
        self.tok, self.stops, self.out = tok, list(stops), out
        self.ids: list[int] = []
        self.printed = 0
        self.cut: int | None = None  # characters kept, once a stop string is found

    def add(self, new_ids: list[int]) -> bool:
        """Take new tokens; True once a stop string was found (the row needs no more)."""
        if self.cut is not None:
            return True
        self.ids.extend(new_ids)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        hits = [text.find(s) for s in self.stops]
        hits = [h for h in hits if h >= 0]
        if hits:
            self.cut = min(hits)
        if self.out is not None:
            stable = len(text.rstrip("\ufffd"))
            if self.cut is not None:
                stable = self.cut
            elif self.stops:  # a stop string may be starting at the end
                stable = max(self.printed, stable - max(map(len, self.stops)) + 1)
            if stable > self.printed:
                self.out(text[self.printed: stable])
                self.printed = stable
        return self.cut is not None

    def text(self) -> str:
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        return text if self.cut is None else text[: self.cut]

    def kept_ids(self, ids: list[int]) -> list[int]:
        """The shortest prefix of `ids` whose text reaches the stop string (all of them without one)."""
        if self.cut is None:
            return list(ids)
        lo, hi = 0, len(ids)
        while lo < hi:  # the first k whose decoded text holds a stop string
            mid = (lo + hi) // 2
            text = self.tok.decode(ids[:mid], skip_special_tokens=True)
            if any(s in text for s in self.stops):
                hi = mid
            else:
                lo = mid + 1
        return list(ids[:lo])

    def finish(self) -> None:
        text = self.text()
        self.out(text[self.printed:] + "\n")
