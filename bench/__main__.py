"""One command for the whole comparison: AR, DFlash and DDTree side by side, JSON, plots, PyTorch.

    python -m bench --out bench/results/run1                                   # the shipped pair
    python -m bench --ckpt DIR --num-prompts 16 --max-new-tokens 128 --budgets 16,64,256 \\
        --policies ddtree,beam:width=4 --temperatures 0,1.0 --repeats 3 --torch-baseline --out DIR
    python -m bench --round-latency qwen3-8b --out DIR     # + bench.bench_round on the 8B shape (GPU)

Writes DIR/bench.json (config, environment, per-config and per-prompt figures), DIR/summary.md
(the table for bench/RESULTS.md) and PNG plots (bench/plots.py). Greedy runs are checked token
by token against AR; a mismatch is reported loudly and recorded (`lossless: false`).

Device calls with a time limit: --compile-workers N compiles every row's executables first, N
rows at a time in threads (nothing is timed meanwhile); --time-limit S ends the run cleanly
within S seconds (rows that would not fit are skipped and listed, bench.json says "partial"),
so that a `timeout` around the call never has to kill it. Each row's line and its
`row_timing` say where its wall time went (compile, warm-up, timed passes, profiled pass).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Sequence

from ddtree_jax.errors import UserError, cli_main


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_policies(text: str) -> list[str]:
    """Comma-separated policy specs; a piece like "b=2" continues the previous spec's options
    ("beam:width=4,ddtree" -> 2 specs, "mine:a=1,b=2" -> 1)."""
    out: list[str] = []
    for piece in _csv(text):
        if out and ":" in out[-1] and "=" in piece and ":" not in piece:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _numbers(text: str, kind, flag: str, minimum) -> list:
    vals = []
    for x in _csv(text):
        try:
            v = kind(x)
        except ValueError:
            raise UserError(f"{flag}: {x!r} is not a{'n integer' if kind is int else ' number'}") from None
        if not math.isfinite(v) or v < minimum:
            raise UserError(f"{flag} values must be >= {minimum} (got {x})")
        if v not in vals:
            vals.append(v)
    if not vals:
        raise UserError(f"{flag} is empty; give a comma-separated list")
    return vals


def build_parser() -> argparse.ArgumentParser:
    from bench.prompts import default_data
    from ddtree_jax.checkpoint import DEFAULT_CKPT

    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--ckpt", default=str(DEFAULT_CKPT), help="converted checkpoint (default: the shipped pair)")
    ap.add_argument("--prompts", help="prompt file (one per line, or JSONL with 'prompt'/'text') instead of the corpus")
    ap.add_argument("--data", default=str(default_data()),
                    help="corpus (JSONL[.xz]); prompts are the first --prompt-tokens tokens of its eval files")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prompt length in tokens (prompts are cut to it)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--methods", default="ar,dflash,ddtree", help="ar always runs: it is every speedup's baseline")
    ap.add_argument("--policies", default="ddtree,beam:width=4", help="tree policies for ddtree")
    ap.add_argument("--budgets", default="16,64,256", help="ddtree budgets")
    ap.add_argument("--temperatures", default="0,1.0", help="0 = greedy (checked against AR token by token)")
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3, help="timed passes over the prompts (medians, min/max)")
    ap.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i")
    ap.add_argument("--profile-prompts", type=int, default=4,
                    help="prompts of the extra profiled pass (per-stage times); 0 skips it")
    ap.add_argument("--profile-temperatures", default=None,
                    help="temperatures that get the profiled pass (default: all of --temperatures)")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32", "float16"),
                    help="compute dtype; auto: the checkpoint's on accelerators, float32 on the CPU (as generate)")
    ap.add_argument("--attn-impl", default="auto")
    ap.add_argument("--matmul-impl", default="auto", choices=("auto", "xla", "pallas", "pallas_interpret"))
    ap.add_argument("--cache-impl", default="auto", choices=("auto", "xla", "pallas", "pallas_interpret"))
    ap.add_argument("--drafter-quant", default="none", choices=("none", "int8"),
                    help="the speculative rows' drafter weights (int8: acceptance may change a little)")
    ap.add_argument("--torch-baseline", action="store_true",
                    help="also time transformers' greedy generate (float32, static cache) on the same prompts")
    ap.add_argument("--torch-repeats", type=int, default=None, help="timed passes of the baseline (default: --repeats)")
    ap.add_argument("--torch-device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="where the baseline runs (auto: the GPU when torch sees one)")
    ap.add_argument("--hf-target", help="HF target directory for --torch-baseline (default: from the checkpoint)")
    ap.add_argument("--verify-loop", action="store_true",
                    help="also time each row's verify pass alone in a device loop: overhead_beyond_verify = "
                         "1 - verify alone / timed round (the profiled stages pay a host sync each)")
    ap.add_argument("--round-latency", metavar="MODEL",
                    help="also run bench.bench_round's round latency on MODEL's shape (random weights, prompt of "
                         "--prompt-tokens, first policy, all budgets; each stage alone in a device loop, so the overhead "
                         "beyond the verify is measured; qwen3-8b: GPU only)")
    ap.add_argument("--compile-workers", type=int, default=1,
                    help="> 1: compile every row's executables before anything is timed, this many rows at a time "
                         "in threads (1: each row compiles in turn, just before it runs)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="end within this many seconds of the start: skip the rows (and the torch baseline) that "
                         "would not fit, judged by the longest row so far, and write a partial bench.json")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar (one line per config instead)")
    ap.add_argument("--out", required=True, help="output directory (bench.json, summary.md, *.png)")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def validate(args) -> dict:
    """Every option checked before anything is loaded; returns the parsed lists."""
    from bench.prompts import read_file
    from ddtree_jax.checkpoint import read_meta
    from ddtree_jax.generator import METHODS
    from ddtree_jax.trees import make_policy

    methods = _csv(args.methods)
    for m in methods:
        if m not in METHODS:
            raise UserError(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
    if not methods:
        raise UserError("--methods is empty; give e.g. ar,dflash,ddtree")
    policies = parse_policies(args.policies)
    if "ddtree" in methods and not policies:
        raise UserError("--policies is empty; give e.g. ddtree,beam:width=4")
    for p in policies:
        try:
            make_policy(p)
        except ValueError as e:
            raise UserError(f"--policies: {e}") from None
    budgets = _numbers(args.budgets, int, "--budgets", 1)
    temps = _numbers(args.temperatures, float, "--temperatures", 0.0)
    prof_temps = None
    if args.profile_temperatures is not None:
        prof_temps = _numbers(args.profile_temperatures, float, "--profile-temperatures", 0.0)
        if set(prof_temps) - set(temps):
            raise UserError(f"--profile-temperatures {args.profile_temperatures} must be among --temperatures")
    for flag, v, lo in (("--num-prompts", args.num_prompts, 1), ("--prompt-tokens", args.prompt_tokens, 1),
                        ("--max-new-tokens", args.max_new_tokens, 1), ("--repeats", args.repeats, 1),
                        ("--profile-prompts", args.profile_prompts, 0), ("--top-k", args.top_k, 0),
                        ("--compile-workers", args.compile_workers, 1),
                        ("--torch-repeats", args.torch_repeats if args.torch_repeats is not None else 1, 1)):
        if v < lo:
            raise UserError(f"{flag} must be >= {lo} (got {v})")
    if not 0 < args.top_p <= 1:
        raise UserError(f"--top-p must be in (0, 1] (got {args.top_p})")
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UserError(f"--time-limit must be a positive number of seconds (got {args.time_limit})")
    if args.round_latency is not None:
        from bench.bench_round import SHAPES

        if args.round_latency not in SHAPES:
            raise UserError(f"--round-latency: unknown model {args.round_latency!r}; choose from {', '.join(SHAPES)}")
    meta = read_meta(args.ckpt)  # "checkpoint X not found; ..." and friends
    if meta.get("drafter") is None and set(methods) - {"ar"}:
        raise UserError(f"{args.ckpt} has no drafter; use --methods ar or a checkpoint with one")
    texts = None
    if args.prompts is not None:
        texts = read_file(args.prompts)  # "not found", "has no prompts", a bad JSON line, an empty prompt
    elif not Path(args.data).is_file():
        raise UserError(f"corpus {args.data} not found; pass --data FILE.jsonl[.xz] or --prompts FILE")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    parent = next(p for p in [out, *out.absolute().parents] if p.exists())
    if not os.access(parent, os.W_OK):
        raise UserError(f"cannot write to {parent}; choose another --out")
    return {"methods": methods, "policies": policies, "budgets": budgets, "temperatures": temps, "meta": meta,
            "profile_temperatures": prof_temps,
            "texts": texts}


def check_context(tcfg, dcfg, prompts, max_new: int, configs) -> None:
    """The request must fit the model's context with each config's cache slack (as Generator checks)."""
    longest = max(len(p.ids) for p in prompts)
    for c in configs:
        budget = {"ar": 0, "dflash": dcfg.depth if dcfg else 0}.get(c.method, c.budget)
        slack = budget + (dcfg.block_size if budget else 0) + 1
        if longest + max_new + slack > tcfg.max_position:
            raise UserError(f"{c.label}: prompts of {longest} tokens + --max-new-tokens {max_new} + {slack} slots of "
                            f"slack exceed the model's context of {tcfg.max_position}; lower --prompt-tokens, "
                            "--max-new-tokens or --budgets")


def write_json(path: Path, obj) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


class _TimeUp(Exception):
    """The --time-limit deadline passed (raised from a progress tick)."""


# seconds of a --time-limit kept for the final writes and plots
FINISH_RESERVE_S = 15.0


def main(argv: Sequence[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = build_parser().parse_args(argv)
    v = validate(args)
    from ddtree_jax.kernels import check_tuned_tables

    try:
        check_tuned_tables()  # a bad $DDTREE_*_TABLE now, not when the first row compiles
    except ValueError as e:
        raise UserError(str(e)) from None
    deadline = None if args.time_limit is None else t_start + args.time_limit - FINISH_RESERVE_S

    from bench import prompts as P
    from bench import suite
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.cli import load_tokenizer, stop_ids_for

    configs = suite.matrix(v["methods"], v["policies"], v["budgets"])
    hf_target = None
    if args.torch_baseline:
        from bench.torch_baseline import pick_device, resolve_hf_target

        hf_target = resolve_hf_target(Path(args.ckpt).absolute(), v["meta"], args.hf_target)
        pick_device(args.torch_device)  # a GPU asked for and absent: say so before the long work
    dtype = args.dtype
    if dtype == "auto":  # XLA:CPU emulates bf16 matmuls; float32 is faster there (generate does the same)
        import jax

        dtype = "float32" if jax.default_backend() == "cpu" else None
    from ddtree_jax import compile_cache

    compile_cache.enable()  # compile time is not timed, but reruns start sooner
    ckpt = load_checkpoint(args.ckpt, dtype=dtype, with_drafter=any(c.method != "ar" for c in configs))
    dtype = dtype or v["meta"].get("dtype")
    tok = load_tokenizer(ckpt)
    if args.prompts is not None:
        prompts = P.from_texts(tok, v["texts"], Path(args.prompts).name, args.num_prompts, args.prompt_tokens)
    else:
        prompts = P.from_corpus(tok, args.data, args.num_prompts, args.prompt_tokens)
    check_context(ckpt.target_cfg, ckpt.drafter_cfg, prompts, args.max_new_tokens, configs)
    stop = [] if args.ignore_eos else stop_ids_for(tok, ckpt.tokenizer_dir)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if len(prompts) < args.num_prompts:
        log(f"[bench] only {len(prompts)} prompts of {args.prompt_tokens} tokens available "
            f"(asked for {args.num_prompts})")

    opts = suite.SuiteOptions(max_new_tokens=args.max_new_tokens, temperatures=v["temperatures"],
                              repeats=args.repeats, seed=args.seed, top_k=args.top_k, top_p=args.top_p,
                              stop_ids=stop, profile_prompts=min(args.profile_prompts, len(prompts)),
                              profile_temperatures=v["profile_temperatures"],
                              attn_impl=args.attn_impl, matmul_impl=args.matmul_impl, cache_impl=args.cache_impl,
                              drafter_quant=args.drafter_quant, compile_workers=args.compile_workers,
                              verify_loop=args.verify_loop)
    env = suite.environment()
    log(f"[bench] {len(configs)} configs x {len(opts.temperatures)} temperatures on {len(prompts)} prompts, "
        f"{args.repeats} repeats, {env['device_kind']} ({env['platform']}), commit {env['commit']}; "
        f"set-up {time.perf_counter() - t_start:.1f}s")

    def make_bench(rows: list[dict], partial: bool) -> dict:
        bench = {
            "schema": suite.SCHEMA,
            "config": {
                "ckpt": str(Path(args.ckpt).absolute()), "ckpt_dtype": v["meta"].get("dtype"),
                "dtype": dtype,
                "prompts": args.prompts, "data": None if args.prompts else args.data, "num_prompts": len(prompts),
                "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens, "methods": v["methods"],
                "policies": v["policies"], "budgets": v["budgets"], "temperatures": v["temperatures"],
                "top_k": args.top_k, "top_p": args.top_p, "repeats": args.repeats, "seed": args.seed,
                "torch_baseline": args.torch_baseline, "torch_repeats": args.torch_repeats or args.repeats,
                "torch_device": args.torch_device,
                "profile_prompts": opts.profile_prompts, "profile_temperatures": v["profile_temperatures"],
                "stop_ids": stop, "attn_impl": args.attn_impl, "matmul_impl": args.matmul_impl,
                "cache_impl": args.cache_impl, "drafter_quant": args.drafter_quant,
                "compile_workers": args.compile_workers, "time_limit": args.time_limit,
                "batch_size": 1, "argv": list(sys.argv[1:] if argv is None else argv),
            },
            "environment": env,
            "prompts": [{"index": p.index, "source": p.source, "num_tokens": len(p.ids)} for p in prompts],
            "runs": rows,
            "all_lossless": all(r["lossless"] is not False for r in rows),
            "mismatches": [{"label": r["label"], **m} for r in rows for m in r.get("mismatches", [])],
            "notes": [
                "tokens_per_s: output tokens / wall time of generate (prefill included), batch 1, summed over "
                "prompts per repeat; median and min/max over repeats",
                "speedup_vs_ar: tokens_per_s median over AR's at the same temperature in this run",
                "mean_acceptance: tokens committed per round (accepted draft tokens + the bonus), pooled over "
                "all rounds of all prompts; acceptance_histogram[k] = rounds that committed k + 1 tokens",
                "stage_ms: ms per round from a separate profiled pass (each stage jitted and synced on its own); "
                "overhead_fraction = (profiled round - verify) / profiled round",
                "verify_alone_ms (--verify-loop): the verify pass alone in a device loop; overhead_beyond_verify = "
                "1 - verify_alone_ms / time_per_round_ms median (the fused rounds of the timed passes)",
                "row_timing: the suite's own wall time per row (s): warm-up (with compiles unless compiled ahead), "
                "timed passes (timed_generate_s of it inside generate's clock), profiled pass, compiles seen",
            ],
        }
        if not bench["all_lossless"] and dtype != "float32":
            bench["notes"].append(
                "greedy mismatches with low-precision weights can be numerical near-ties (verify runs 1 + N tokens "
                "through other matmul shapes than AR's 1); rerun with --dtype float32 to tell them from a bug")
        if partial:
            bench["partial"] = f"{len(rows)} of {len(configs) * len(opts.temperatures)} rows: the run stopped early"
        if skipped:
            bench["partial"] = (f"{len(rows)} of {len(configs) * len(opts.temperatures)} rows: --time-limit "
                                f"{args.time_limit:g}s left no time for the rest")
            bench["not_run"] = list(skipped)
        if ahead is not None:
            bench["compile_ahead"] = ahead
        return bench

    skipped, ahead = [], None
    res = suite.run_suite(ckpt, prompts, configs, opts, progress=not args.no_progress, log=log,
                          on_row=lambda rs: write_json(out / "bench.json", make_bench(rs, True)), deadline=deadline)
    rows, reference, skipped, ahead = res["rows"], res["reference"], res["skipped"], res["compile_ahead"]
    bench = make_bench(rows, False)
    write_json(out / "bench.json", bench)  # written before the optional parts: a crash there keeps it

    def out_of_time() -> bool:
        return deadline is not None and time.perf_counter() > deadline

    tb = None
    if args.torch_baseline and out_of_time():
        bench.setdefault("not_run", []).append("torch baseline")
        log("[bench] time limit: the torch baseline not run")
    elif args.torch_baseline:
        from tqdm import tqdm

        from bench import torch_baseline

        ar0 = next((r for r in rows if r["method"] == "ar" and r["temperature"] == 0), None)
        ref = reference.get(0.0)  # our greedy AR tokens
        reps = args.torch_repeats or args.repeats

        def tick(n=1):
            bar.update(n)
            if out_of_time():
                raise _TimeUp

        t_torch = time.perf_counter()
        try:
            with tqdm(total=1 + reps * len(prompts), desc="torch", unit="gen", file=sys.stderr,
                      disable=args.no_progress, dynamic_ncols=True) as bar:
                tb = torch_baseline.run(hf_target, prompts, args.max_new_tokens, stop, reps, ref, tick=tick,
                                        device=args.torch_device)
        except _TimeUp:
            bench.setdefault("not_run", []).append("torch baseline")
            log(f"[bench] time limit: the torch baseline stopped after {time.perf_counter() - t_torch:.0f}s")
    if tb is not None:
        tb["wall_s"] = time.perf_counter() - t_torch
        if ar0 is not None:
            tb["jax_ar_tokens_per_s"] = ar0["tokens_per_s"]["median"]
            tb["jax_ar_speedup_over_torch"] = ar0["tokens_per_s"]["median"] / tb["tokens_per_s"]["median"]
        bench["torch_baseline"] = tb
        log(f"[bench] torch {tb['cache_implementation']} cache: {tb['tokens_per_s']['median']:.1f} tok/s, "
            f"tokens equal to our AR on {tb['equal_to_jax_ar']} prompts ({tb['wall_s']:.0f}s)")
        write_json(out / "bench.json", bench)

    if args.round_latency and out_of_time():
        bench.setdefault("not_run", []).append("round latency")
        log("[bench] time limit: the round latency not run")
    elif args.round_latency:
        import jax

        if jax.default_backend() == "cpu" and args.round_latency != "tiny":
            log(f"[bench] --round-latency {args.round_latency} on a CPU: this is slow and says little")
        bench["round_latency"] = suite.round_latency(args.round_latency, v["budgets"], v["policies"][:1],
                                                     args.repeats, args.prompt_tokens, attn_impl=args.attn_impl,
                                                     log=log)
        write_json(out / "bench.json", bench)

    bench["wall_s"] = time.perf_counter() - t_start
    write_json(out / "bench.json", bench)
    table = suite.summary_markdown(bench)
    (out / "summary.md").write_text(table)
    if not args.no_plots:
        from bench.plots import draw_all

        if not draw_all(bench, out):
            log("[bench] no rows: no plots")
    print(table, end="")
    if not bench["all_lossless"]:
        hint = "" if bench["config"]["dtype"] == "float32" else "; rerun with --dtype float32 to rule out near-ties"
        log(f"[bench] !!! LOSSLESS CHECK FAILED for {sorted({m['label'] for m in bench['mismatches']})}: "
            f"see 'mismatches' in {out / 'bench.json'}{hint}")
    log(f"[bench] wrote {out}/bench.json, summary.md{'' if args.no_plots else ' and plots'} in {bench['wall_s']:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main, prog="bench"))
