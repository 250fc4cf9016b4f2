"""Tokens/s against batch size: AR, DFlash and DDTree measured end to end, and projected at a large shape.

    python -m bench throughput --out DIR                       # the shipped pair, 32 eval prompts, batches 1..32
    python -m bench throughput --num-prompts 16 --max-new-tokens 64 --batches 1,2,4,8,16 --budgets 16,64 \\
        --cli-check --out DIR                                  # + the batched CLI's wall time (issue 56)
    python -m bench throughput --record rec.npz --cost-model cost.json --out DIR
    python -m bench throughput --record rec.npz --budgets 64,256,auto --no-measure --out DIR   # projection only

Measured: every prompt is decoded in batches of each --batches size, for each method and budget,
through `Generator.generate_ids` as `python -m ddtree_jax.generate --batch-size N` calls it
(consecutive prompts, seed + the batch's first index). One untimed warm-up per batch shape
(compilation, first allocation), then --repeats timed passes; tokens/s = generated tokens / the
pass's wall time (prefill and host work included), median over passes. Each prompt's tokens are
compared with its tokens at the smallest batch size of the same method (batch 1 by default) and,
when greedy, with AR's: a mismatch is reported, never hidden. --cli-check runs the CLI itself in
a subprocess per batch size (one warm-up run fills the persistent compile cache, then one timed
run: process wall time, start-up included).

Projected: tokens/s = 1000 x batch x tokens a round / round ms (bench/projection.py), the round
times from a cost model (ddtree_jax/cost.py: by default the shipped one of --project-shape) and
the tokens a round from the measured runs above or, with --record, from an offline replay
(ddtree_jax.research). A projection, not a measurement: cells the cost model does not cover stay
blank. `auto` is projected from a record only (a measured Result does not report its per-round
choices): per batch size b, the record's prompts replayed in lockstep batches of b with the
engine's chooser at the cost model's batch-b costs after --project-prefix tokens; tokens/s =
b x tokens a round / the mean modelled ms of its picks' rounds. --no-measure skips the
measured runs (the projection then needs --record).

Writes DIR/throughput.json (after every row: a cut run keeps its rows), summary.md,
throughput_measured.png and throughput_projected.png.
"""
from __future__ import annotations

import gc
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Sequence

from bench.projection import BATCHES, batch_list, label, project, table
from bench.suite import RunConfig, _csv, check_context, environment, spread, write_json
from bench.torch_baseline import first_mismatch
from ddtree_jax.errors import ArgumentParser, UserError, cli_main

SCHEMA = "ddtree-jax-throughput/1"
AUTO = "auto"  # the engine's budget chooser: passed through to Generator, which decides whether it takes it


# ---------------------------------------------------------------------------------------------- configs


def parse_budgets(text: str) -> list[int | str]:
    """'16,64,auto' -> [16, 64, 'auto'] (UserError for anything else)."""
    from ddtree_jax import cost

    try:
        return cost.parse_budgets(text, auto=True)
    except ValueError as e:
        raise UserError(f"--budgets: {e}") from None


def configs_of(methods: Sequence[str], budgets: Sequence[int | str]) -> list[tuple[str, int | str]]:
    """(method, budget) in run order: AR, DFlash, then DDTree by budget (AR's and DFlash's budget is 0)."""
    out = [(m, 0) for m in ("ar", "dflash") if m in methods]
    return out + [("ddtree", b) for b in budgets] if "ddtree" in methods else out


def name_of(method: str, budget: int | str) -> str:
    """A config's series name, as bench/projection.py names it (AR, DFlash, DDTree-64, auto)."""
    return label(budget if method == "ddtree" else method)


def parse_cli_check(text: str, methods: Sequence[str], budgets: Sequence[int | str]) -> tuple[str, int | str]:
    """--cli-check's METHOD[:BUDGET]; '' picks the last of the run's configs (the largest DDTree budget)."""
    if not text:
        return configs_of(methods, [b for b in budgets if b != AUTO] or [64])[-1]
    method, _, budget = text.partition(":")
    if method not in ("ar", "dflash", "ddtree"):
        raise UserError(f"--cli-check: unknown method {method!r}; give ar, dflash or ddtree:BUDGET")
    if method != "ddtree":
        return method, 0
    if not budget.isdigit() or int(budget) < 1:
        raise UserError(f"--cli-check {text}: give ddtree:BUDGET with a budget >= 1 (the CLI's --budget)")
    return method, int(budget)


# ---------------------------------------------------------------------------------------------- measured


def make_generator(ckpt, method: str, budget: int | str, executables=None):
    """The Generator of one config; `auto` goes to Generator as is, and a refusal is one line.
    executables: shared between configs, so that those whose prefill is the same compile it once."""
    from ddtree_jax.generator import Generator

    try:
        return Generator(ckpt, method=method, policy="ddtree", budget=budget if method == "ddtree" else 1,
                         executables=executables)
    except (TypeError, ValueError) as e:
        if budget != AUTO:
            raise
        raise UserError(f"--budgets auto: this Generator does not take budget 'auto' ({type(e).__name__}: {e}); "
                        "leave it out of --budgets until the engine's --budget auto lands") from None


def decode_all(gen, prompts, batch: int, kw: dict) -> tuple[list, float]:
    """Every prompt through gen in batches of `batch`, as the CLI's --prompt-file --batch-size does
    (consecutive prompts, seed + the batch's first index): (results in prompt order, wall s)."""
    results = []
    t0 = time.perf_counter()
    for start in range(0, len(prompts), batch):
        chunk = [list(p.ids) for p in prompts[start:start + batch]]
        results += gen.generate_ids(chunk, **dict(kw, seed=kw["seed"] + start))
    return results, time.perf_counter() - t0


def warm_up(gen, prompts, batch: int, kw: dict) -> float:
    """One untimed generation per batch shape a pass uses (the full batch and the remainder): the
    compiles and first allocations; its wall s."""
    t0 = time.perf_counter()
    for size in sorted({min(batch, len(prompts)), len(prompts) % batch} - {0}):
        gen.generate_ids([list(p.ids) for p in prompts[:size]], **kw)
    return time.perf_counter() - t0


def compare_tokens(tokens: Sequence[Sequence[int]], ref: Sequence[Sequence[int]]) -> list[dict]:
    """Prompts whose tokens differ from the reference: index, first differing position, the tokens there."""
    bad = []
    for i, (ours, theirs) in enumerate(zip(tokens, ref)):
        at = first_mismatch(ours, theirs)
        if at is not None:
            bad.append({"prompt": i, "first_mismatch": at, "ours": list(ours[max(0, at - 2): at + 6]),
                        "reference": list(theirs[max(0, at - 2): at + 6])})
    return bad


def measure_row(gen, prompts, batch: int, repeats: int, kw: dict) -> tuple[dict, list[list[int]]]:
    """One (config, batch) row and its tokens per prompt."""
    warm_s = warm_up(gen, prompts, batch, kw)
    passes = [decode_all(gen, prompts, batch, kw) for _ in range(repeats)]
    results = passes[0][0]  # the tokens are the same every pass (same seeds); the clock is what repeats
    tokens = sum(r.num_output_tokens for r in results)
    walls = [w for _, w in passes]
    # a batch's results share its clock: one time_s, and the device runs its longest row's rounds
    firsts = range(0, len(prompts), batch)
    generate_s = [sum(res[i].time_s for i in firsts) for res, _ in passes]
    accept = [a for r in results for a in r.acceptance_lengths]
    row = {"method": gen.method, "budget": gen.budget, "label": name_of(gen.method, gen.budget), "batch": batch,
           "effective_batch": min(batch, len(prompts)), "num_prompts": len(prompts), "repeats": repeats, "output_tokens": tokens,
           "tokens_per_s": tokens / statistics.median(walls),
           "tokens_per_s_spread": spread([tokens / w for w in walls]),
           "wall_s": spread(walls), "generate_s": spread(generate_s), "warmup_s": warm_s,
           "device_rounds": sum(max(r.rounds for r in results[i:i + batch]) for i in firsts),
           "rounds": sum(r.rounds for r in results),
           "mean_acceptance": sum(accept) / len(accept) if accept else 0.0}
    return row, [r.token_ids for r in results]


def row_line(row: dict) -> str:
    eq = {True: "tokens equal", False: f"TOKENS DIFFER on {len(row.get('mismatches', []))} prompts",
          None: "sampled"}[row["tokens_equal"]]
    return (f"[throughput] {row['label']:<11} batch {row['batch']:>3}: {row['tokens_per_s']:9.1f} tok/s, "
            f"{row['device_rounds']} rounds, acceptance {row['mean_acceptance']:.2f}, {eq} "
            f"(against batch {row['reference_batch']})")


# ---------------------------------------------------------------------------------------------- the CLI check


def cli_argv(args, prompt_file: Path, method: str, budget: int | str, batch: int) -> list[str]:
    argv = [sys.executable, "-m", "ddtree_jax.generate", "--ckpt", str(Path(args.ckpt).absolute()),
            "--prompt-file", str(prompt_file), "--batch-size", str(batch), "--json", "--method", method,
            "--max-new-tokens", str(args.max_new_tokens), "--temperature", str(args.temperature),
            "--dtype", args.dtype]
    if method == "ddtree":
        argv += ["--budget", str(budget)]
    if args.temperature > 0:
        argv += ["--seed", str(args.seed)]
    return argv + (["--ignore-eos"] if args.ignore_eos else [])


def run_cli(argv: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    """(wall s, the finished process) of one CLI run."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    return time.perf_counter() - t0, proc


def cli_row(argv: list[str], batch: int, runner=run_cli) -> tuple[dict, list[list[int]] | None]:
    """One batch size of the CLI check: a warm-up run (the persistent compile cache), then a timed one."""
    runner(argv)
    wall, proc = runner(argv)
    row = {"batch": batch, "wall_s": wall, "returncode": proc.returncode, "command": " ".join(argv[1:])}
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        row["error"] = lines[-1] if lines else f"exit {proc.returncode}"
        return row, None
    objs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    # the Generator's "... compiled in 1.2s" lines: how warm the persistent compile cache was
    row["compile_s"] = sum(float(m) for m in re.findall(r"compiled in ([0-9.]+)s", proc.stderr))
    tokens = sum(o["num_output_tokens"] for o in objs)
    generate_s = sum(objs[i]["time_s"] for i in range(0, len(objs), batch))  # one clock a batch
    row.update(num_prompts=len(objs), output_tokens=tokens, tokens_per_s_wall=tokens / wall,
               generate_s=generate_s, tokens_per_s_generate=tokens / generate_s if generate_s > 0 else None)
    return row, [o["token_ids"] for o in objs]


def cli_check(args, config: tuple[str, int | str], texts: Sequence[str], batches: Sequence[int], out: Path,
              on_row, status=lambda s: None) -> dict:
    """The CLI on the prompts' texts (DIR/cli_prompts.jsonl) at each batch size; on_row(check) after each."""
    method, budget = config
    prompt_file = out / "cli_prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    cc = {"label": name_of(method, budget), "method": method, "budget": budget, "prompt_file": str(prompt_file),
          "rows": []}
    ref = None
    for batch in batches:
        status(f"CLI {cc['label']} batch {batch}")
        row, tokens = cli_row(cli_argv(args, prompt_file, method, budget, batch), batch)
        if tokens is not None:
            ref = ref or (batch, tokens)
            cc["reference_batch"] = ref[0]
            row["tokens_equal"] = None
            if args.temperature == 0:
                row["mismatches"] = compare_tokens(tokens, ref[1])
                row["tokens_equal"] = not row["mismatches"]
        cc["rows"].append(row)
        on_row(cc)
    return cc


# ---------------------------------------------------------------------------------------------- projected


def signature_for(shape: str):
    from bench.fit_cost import signature

    return signature(shape, "bfloat16", "--project-shape")


def pick_cost_model(args):
    """The cost model of the projection: --cost-model's file, or the shipped one of --project-shape
    on --project-device (default, where several devices ship one: this device's, else the one
    that covers the most batch sizes); one line when there is none."""
    from ddtree_jax import cost

    if args.cost_model is not None:
        return cost.load_cost_model(args.cost_model)
    sig = signature_for(args.project_shape)
    shipped = [m for m in map(cost.load_cost_model, sorted(cost.SHIPPED_DIR.glob("*.json"))) if m.model == sig]
    kinds = sorted({m.device_kind for m in shipped})
    if args.project_device is not None:
        shipped = [m for m in shipped if m.device_kind == args.project_device]
    elif len(shipped) > 1:
        import jax

        here = [m for m in shipped if m.device_kind == jax.devices()[0].device_kind]
        shipped = here or [max(shipped, key=lambda m: (len({p.batch for p in m.points}), len(m.points)))]
    if len(shipped) != 1:
        have = f"shipped for {', '.join(kinds)}" if kinds else "none is shipped"
        raise UserError(f"no single shipped cost model for {args.project_shape} in bf16"
                        f"{' on ' + args.project_device if args.project_device else ''} ({have}); pick one with "
                        f"--project-device, give --cost-model FILE ({cost.REFIT}), or --no-project")
    return shipped[0]


def replayed_acceptance(path: str, configs, stop: bool, model=None, batches: Sequence[int] = (),
                        prefix: float = 512) -> tuple[dict, str]:
    """Tokens a round of each speculative config, replayed from a research record (ending each
    prompt at the record's stop ids where `stop`, as generate does without --ignore-eos); `auto`
    (given the cost model) per batch size: its tokens a round and its share of rounds at each
    candidate, replayed in lockstep batches (`auto_choices`)."""
    from ddtree_jax.research import load_record, replay

    rec = load_record(path)
    acc: dict = {}
    for method, budget in configs:
        if method == "dflash":
            acc["dflash"] = replay(rec, "chain", rec.depth, stop=stop).mean_acceptance
        elif method == "ddtree" and budget != AUTO:
            acc[str(budget)] = replay(rec, "ddtree", budget, stop=stop).mean_acceptance
        elif method == "ddtree" and model is not None:
            acc["auto"] = auto_choices(rec, model, batches, prefix, stop)
    ck = rec.header["checkpoint"].get("path", "?")
    return acc, (f"replayed from the record {path} (checkpoint {ck}, {rec.num_prompts} prompts x "
                 f"{rec.max_new_tokens} new tokens, greedy)")


def auto_choices(rec, model, batches: Sequence[int], prefix: float, stop: bool) -> dict:
    """{batch: {"tokens": tokens a round, "choices": {candidate: share of rounds}}} of the
    engine's `--budget auto` (its default candidates) replayed in lockstep batches of each size,
    choosing at the model's costs after `prefix` tokens (those the projection charges); a batch
    the model covers none of them at, or larger than the record's prompts, is left out (blank)."""
    from ddtree_jax.cost import auto_lines
    from ddtree_jax.research import auto_budget, replay

    budget = auto_budget(model, prefix=prefix)
    out = {}
    for b in batches:
        sizes = {b, rec.num_prompts % b} - {0}  # the last batch holds the prompts left over
        if b > rec.num_prompts or any(auto_lines(model, ("dflash", *budget.budgets), n) is None for n in sizes):
            continue
        res = replay(rec, "ddtree", budget, batch=b, stop=stop)
        out[str(b)] = {"tokens": res.mean_acceptance, "choices": {str(c): v for c, v in res.choices.items()},
                       "mean_round_ms": res.mean_round_ms}
    return out


def measured_acceptance(rows: Sequence[dict]) -> dict:
    """Tokens a round of each fixed speculative config at its reference batch (the smallest)."""
    acc = {}
    for r in rows:
        key = "dflash" if r["method"] == "dflash" else str(r["budget"])
        if r["method"] != "ar" and r["budget"] != AUTO and r["batch"] == r["reference_batch"] \
                and r["mean_acceptance"] >= 1:
            acc[key] = r["mean_acceptance"]
    return acc


def projection(model, acceptance: dict, batches, prefix: int, source: str, shape: str) -> dict:
    proj = project(model, acceptance, batches, prefix, where="acceptance")
    proj.update(
        note=(f"a projection, not a measurement: round times of the cost model ({model.device_kind}, {shape}) "
              f"x tokens a round {source}; cells it does not cover are blank (null), never extrapolated"),
        acceptance=acceptance, acceptance_source=source, shape=shape, cost_model_source=model.source,
        cost_model_covers=model.describe(one_line=True))
    return proj


# ---------------------------------------------------------------------------------------------- output


def plot_lines(batches: Sequence[int], series: dict, title: str, ylabel: str, path: Path, note: str = "") -> Path:
    """Tokens/s against batch size (log2 axis), one line per series; blank cells left out of their line."""
    from bench.plots import _panels, _save

    fig, (ax,) = _panels(1, title)
    for name, values in series.items():
        pts = [(b, v) for b, v in zip(batches, values) if v is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(batches), [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel(ylabel)
    if any(v is not None for vs in series.values() for v in vs):
        ax.legend(fontsize=8)
    fig.set_size_inches(8.5, 5.6 if note else 4.6)
    if note:  # an annotation of the axes: tight_layout makes room for it below them
        ax.annotate(textwrap.fill(note, 140), xy=(0, -0.14), xycoords="axes fraction", va="top", fontsize=6.5)
    return _save(fig, path)


def measured_series(rows: Sequence[dict], batches: Sequence[int]) -> dict:
    """Series name -> tokens/s at each batch size (None where a row is missing)."""
    series: dict = {}
    for r in rows:
        series.setdefault(r["label"], [None] * len(batches))[list(batches).index(r["batch"])] = r["tokens_per_s"]
    return series


def measured_table(doc: dict) -> str:
    batches = doc["config"]["batches"]
    head = "| method | " + " | ".join(f"batch {b}" for b in batches) + " | mean acceptance | tokens equal |"
    lines = [head, "|" + " --- |" * (len(batches) + 3)]
    for name, values in measured_series(doc["measured"], batches).items():
        rows = [r for r in doc["measured"] if r["label"] == name]
        equal = {r["tokens_equal"] for r in rows}
        eq = "n/a (sampled)" if equal == {None} else "yes" if equal == {True} else (
            "**NO** at batch " + ", ".join(str(r["batch"]) for r in rows if r["tokens_equal"] is False))
        if any(r.get("lossless_vs_ar") is False for r in rows):
            eq += "; **differs from AR**"
        lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.1f}" for v in values)
                     + f" | {rows[0]['mean_acceptance']:.2f} | {eq} |")
    return "\n".join(lines)


def summary_markdown(doc: dict) -> str:
    c, env = doc["config"], doc["environment"]
    stamp = f"Command: `{c['command']}`  \nCommit: `{env.get('describe') or env.get('commit')}`"
    out = ["# Tokens/s against batch size\n"]
    if c.get("measured") is False:
        out.append("## Measured\n\n--no-measure: nothing decoded; the projection alone.\n")
    else:
        out += [f"## Measured: end to end on {c['ckpt']} ({device_name(env)}, {c['dtype']})\n",
                stamp + "\n",
                f"{c['num_prompts']} prompts of {c['prompt_tokens']} tokens, {c['max_new_tokens']} new tokens, "
                f"temperature {c['temperature']:g}, median of {c['repeats']} timed passes; tokens/s = generated "
                f"tokens / wall time of a pass (prefill included). Tokens compared with each prompt's tokens at "
                f"the smallest batch of the same method.\n",
                measured_table(doc) + "\n"]
    if doc.get("cli_check"):
        cc = doc["cli_check"]
        out.append(f"The CLI (`python -m ddtree_jax.generate --prompt-file F --batch-size N --json`, "
                   f"{cc['label']}, warm compile cache; wall time of the process, start-up included):\n")
        out.append("| batch | wall s | of it compiling | tokens/s (wall) | tokens/s (in generate) | tokens equal to "
                   f"batch {cc.get('reference_batch')} |\n| --- | --- | --- | --- | --- | --- |")
        for r in cc["rows"]:
            if "error" in r:
                out.append(f"| {r['batch']} | failed: {r['error']} | | | | |")
                continue
            eq = {True: "yes", False: "**NO**", None: "n/a"}[r.get("tokens_equal")]
            gen = "-" if r["tokens_per_s_generate"] is None else f"{r['tokens_per_s_generate']:.1f}"
            out.append(f"| {r['batch']} | {r['wall_s']:.1f} | {r['compile_s']:.1f} | {r['tokens_per_s_wall']:.1f} | "
                       f"{gen} | {eq} |")
        out.append("")
    proj = doc.get("projection")
    if proj:
        out += [f"## Projected (a projection, not a measurement): {proj['shape']} on {proj['device']}\n",
                stamp + "\n", proj["note"] + f". Prefix {proj['prefix']} tokens.\n",
                f"Tokens a round: {json.dumps(proj['acceptance'])}.\n",
                f"The cost model covers: {proj['cost_model_covers']}.\n", table(proj) + "\n"]
    elif doc.get("projection_skipped"):
        out += ["## Projected\n", doc["projection_skipped"] + "\n"]
    return "\n".join(out)


def device_name(env: dict) -> str:
    """'NVIDIA H100 80GB HBM3 (gpu)', or 'cpu' where the kind is the platform."""
    kind, platform = env["device_kind"], env["platform"]
    return kind if kind == platform else f"{kind} ({platform})"


def git_describe() -> str | None:
    try:
        r = subprocess.run(["git", "--no-optional-locks", "describe", "--always", "--dirty", "--tags"],
                           cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> ArgumentParser:
    from bench.prompts import default_data
    from ddtree_jax.checkpoint import DEFAULT_CKPT

    ap = ArgumentParser(prog="python -m bench throughput", description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", default=str(DEFAULT_CKPT), help="converted checkpoint (default: the shipped pair)")
    ap.add_argument("--data", default=str(default_data()), help="corpus whose eval files give the prompts "
                                                                 "(default: the shipped eval prompts)")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="each prompt's length in tokens")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batches", type=batch_list, default=list(BATCHES), help="batch sizes, comma-separated")
    ap.add_argument("--methods", default="ar,dflash,ddtree", help="any of ar, dflash, ddtree")
    ap.add_argument("--budgets", default="16,64,256", help="DDTree budgets; 'auto' is passed to the engine as is")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (tokens must match across batches)")
    ap.add_argument("--seed", type=int, default=0, help="a batch starting at prompt i samples with seed + i (the CLI's)")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes over the prompts (median)")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    ap.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float32", "float16"),
                    help="auto: the checkpoint's on accelerators, float32 on the CPU (as generate)")
    ap.add_argument("--cli-check", nargs="?", const="", default=None, metavar="METHOD[:BUDGET]",
                    help="also time python -m ddtree_jax.generate --batch-size N per batch size, in a subprocess "
                         "(default config: the last of the run's, e.g. ddtree:256)")
    ap.add_argument("--cost-model", help="cost model JSON of the projection (default: the shipped one of "
                                         "--project-shape)")
    ap.add_argument("--project-shape", default="qwen3-8b", help="bench round's model shape the projection is for")
    ap.add_argument("--project-device", help="device kind of the shipped cost model (where several ship)")
    ap.add_argument("--project-prefix", type=int, default=512, help="prefix length the round times are taken at")
    ap.add_argument("--record", help="research record (python -m ddtree_jax.research record) whose replay gives "
                                     "the projection's tokens a round, instead of the measured runs")
    ap.add_argument("--no-project", action="store_true", help="measure only")
    ap.add_argument("--no-measure", action="store_true", help="project only, from --record (no decoding)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--force", action="store_true", help="write into a non-empty --out")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def validate(args) -> dict:
    """Every option checked before anything long runs; one UserError line otherwise."""
    from ddtree_jax.checkpoint import read_meta
    from ddtree_jax.generator import METHODS

    methods = _csv(args.methods)
    if not methods:
        raise UserError(f"--methods is empty; give some of {', '.join(METHODS)}")
    for m in methods:
        if m not in METHODS:
            raise UserError(f"--methods: unknown method {m!r}; choose from {', '.join(METHODS)}")
    budgets = parse_budgets(args.budgets)
    for flag, v in (("--num-prompts", args.num_prompts), ("--prompt-tokens", args.prompt_tokens),
                    ("--max-new-tokens", args.max_new_tokens), ("--repeats", args.repeats),
                    ("--project-prefix", args.project_prefix)):
        if v < 1:
            raise UserError(f"{flag} must be >= 1 (got {v})")
    if not args.temperature >= 0:
        raise UserError(f"--temperature must be >= 0 (got {args.temperature}); 0 means greedy")
    meta = read_meta(args.ckpt)
    if meta.get("drafter") is None and set(methods) - {"ar"}:
        raise UserError(f"{args.ckpt} has no drafter; use --methods ar or a checkpoint with one")
    if not Path(args.data).is_file():
        raise UserError(f"corpus {args.data} not found; pass --data FILE.jsonl[.xz]")
    cli = None if args.cli_check is None else parse_cli_check(args.cli_check, methods, budgets)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UserError(f"--out {out} is not empty; give another directory or --force to write into it")
    if args.record is not None and args.no_project:
        raise UserError("--record gives the projection's acceptance; drop it or --no-project")
    if args.no_measure and (args.record is None or args.no_project):
        raise UserError("--no-measure projects from a record only; give --record FILE (python -m "
                        "ddtree_jax.research record) and drop --no-project")
    if args.no_measure and cli is not None:
        raise UserError("--cli-check measures the CLI; drop it or --no-measure")
    cost_model = None
    if not args.no_project:
        cost_model = pick_cost_model(args)
        if args.record is not None and not Path(args.record).is_file():
            raise UserError(f"record {args.record} not found; record one with python -m ddtree_jax.research "
                            f"record --out {args.record}")
    return {"methods": methods, "budgets": budgets, "configs": configs_of(methods, budgets), "cli": cli,
            "cost_model": cost_model, "meta": meta}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    v = validate(args)
    batches = sorted(set(args.batches))
    configs = v["configs"]
    if v["cli"] is not None:  # the generate subprocesses need the GPU's memory that JAX would preallocate here
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

    import jax

    from ddtree_jax import compile_cache

    if args.dtype == "auto":  # XLA:CPU emulates bf16 matmuls; float32 is faster there (generate does the same)
        args.dtype = "float32" if jax.default_backend() == "cpu" else (v["meta"].get("dtype") or "bfloat16")
    compile_cache.enable()  # compile time is never timed; reruns start sooner
    out = Path(args.out)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    env = dict(environment(), describe=git_describe())
    doc = {"schema": SCHEMA,
           "config": {"command": "python -m bench throughput " + " ".join(argv),
                      "ckpt": str(Path(args.ckpt).absolute()), "dtype": args.dtype, "data": args.data,
                      "num_prompts": args.num_prompts, "prompt_tokens": args.prompt_tokens,
                      "max_new_tokens": args.max_new_tokens, "batches": batches, "methods": v["methods"],
                      "budgets": v["budgets"], "temperature": args.temperature, "seed": args.seed,
                      "repeats": args.repeats, "stop_ids": [], "tree_policy": "ddtree",
                      "measured": not args.no_measure},
           "environment": env, "prompts": [], "measured": [], "cli_check": None, "projection": None,
           "notes": ["tokens_per_s: generated tokens / wall time of one pass over every prompt in batches of "
                     "`batch` (prefill and host work included), median over repeats; generate_s: the same "
                     "passes' time inside generate_ids",
                     "device_rounds: rounds the device ran (a batch runs until its longest row is done); rounds: "
                     "the rows' rounds; mean_acceptance: tokens a row-round, pooled",
                     "tokens_equal: every prompt's tokens equal its tokens at reference_batch (same method); "
                     "lossless_vs_ar: equal to AR's at AR's reference batch (greedy only)"]}
    save = lambda: write_json(out / "throughput.json", doc)  # noqa: E731
    model = v["cost_model"]
    acceptance, source = None, None
    if model is not None and args.record is not None:
        acceptance, source = replayed_acceptance(args.record, configs, stop=not args.ignore_eos, model=model,
                                                 batches=batches, prefix=args.project_prefix)
    out.mkdir(parents=True, exist_ok=True)
    if not args.no_measure:
        measure(args, v, batches, doc, save, log)

    if model is None:
        doc["projection_skipped"] = "--no-project: no projection."
    else:
        if acceptance is None:
            acceptance = measured_acceptance(doc["measured"])
            source = (f"measured above on {Path(args.ckpt).name} (batch {batches[0]} rows; no --record given, "
                      f"so not from a replay)")
        shape = args.project_shape if args.cost_model is None else f"the cost model's shape ({args.cost_model})"
        doc["projection"] = projection(model, acceptance, batches, args.project_prefix, source, shape)
        if any(b == AUTO for _, b in configs) and "auto" not in acceptance:
            doc["projection"]["note"] += "; auto is projected from a --record only (a measured run does not " \
                                         "report its per-round choices)"
    save()
    (out / "summary.md").write_text(summary_markdown(doc))
    if doc["measured"]:
        plot_lines(batches, measured_series(doc["measured"], batches),
                   f"measured tokens/s, {Path(args.ckpt).name} on {device_name(env)}, {len(doc['prompts'])} prompts x "
                   f"{args.max_new_tokens} new tokens", "tokens/s (measured)", out / "throughput_measured.png")
    if doc["projection"]:
        proj = doc["projection"]
        plot_lines(batches, {k: s["tokens_per_s"] for k, s in proj["series"].items()},
                   f"PROJECTION (not measured): tokens/s, {proj['shape']} on {proj['device']}, prefix {proj['prefix']}",
                   "tokens/s (projected)", out / "throughput_projected.png",
                   note=f"{proj['note']}. Cost model covers: {proj['cost_model_covers']}")
    print(summary_markdown(doc), end="")
    bad = [r for r in doc["measured"] if r["tokens_equal"] is False or r.get("lossless_vs_ar") is False]
    if bad:
        log(f"[throughput] !!! TOKENS DIFFER for {sorted({(r['label'], r['batch']) for r in bad})}: see "
            f"'mismatches' in {out / 'throughput.json'}")
    log(f"[throughput] wrote {out}/throughput.json, summary.md and plots")
    return 0


def measure(args, v: dict, batches: list[int], doc: dict, save, log) -> None:
    """The measured rows (and the CLI check) into doc, saved after each."""
    from tqdm import tqdm

    from bench import prompts as P
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.cli import stop_ids_for
    from ddtree_jax.generator import Executables
    from ddtree_jax.tokenizer import load_tokenizer

    configs = v["configs"]
    ckpt = load_checkpoint(args.ckpt, dtype=args.dtype, with_drafter=any(m != "ar" for m, _ in configs))
    tok = load_tokenizer(ckpt)
    prompts = P.from_corpus(tok, args.data, args.num_prompts, args.prompt_tokens)
    check_context(ckpt.target_cfg, ckpt.drafter_cfg, prompts, args.max_new_tokens,
                  [RunConfig(m, "ddtree", b) for m, b in configs if b != AUTO])
    if any(b == AUTO for _, b in configs):
        make_generator(ckpt, "ddtree", AUTO)  # a Generator that refuses auto says so before the long work
    stop = [] if args.ignore_eos else stop_ids_for(tok, ckpt.tokenizer_dir)
    out = Path(args.out)
    if len(prompts) < args.num_prompts:
        log(f"[throughput] only {len(prompts)} prompts of {args.prompt_tokens} tokens available "
            f"(asked for {args.num_prompts})")
    if batches[-1] > len(prompts):
        log(f"[throughput] batch sizes above {len(prompts)} decode all {len(prompts)} prompts in one batch "
            f"(their rows' effective_batch)")
    doc["config"].update(num_prompts=len(prompts), stop_ids=stop)
    doc["prompts"] = [{"index": p.index, "source": p.source, "num_tokens": len(p.ids)} for p in prompts]
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed, stop_ids=stop)
    greedy = args.temperature == 0
    cli_batches = batches if v["cli"] is not None else []
    bar = tqdm(total=len(configs) * len(batches) + len(cli_batches), desc="throughput", unit="row",
               disable=args.no_progress, file=sys.stderr, dynamic_ncols=True)
    say = (lambda s: bar.write(s, file=sys.stderr)) if not args.no_progress else log
    ar_tokens = None
    executables = Executables()
    try:
        for method, budget in configs:
            gen = make_generator(ckpt, method, budget, executables)
            ref = None
            for batch in batches:
                bar.set_postfix_str(f"{name_of(method, budget)} batch {batch}")
                row, tokens = measure_row(gen, prompts, batch, args.repeats, kw)
                ref = ref or (batch, tokens)
                row["reference_batch"] = ref[0]
                row["tokens_equal"] = None
                if greedy:
                    row["mismatches"] = compare_tokens(tokens, ref[1])
                    row["tokens_equal"] = not row["mismatches"]
                    if method == "ar" and ar_tokens is None:
                        ar_tokens = tokens
                    if ar_tokens is not None:
                        row["mismatches_vs_ar"] = compare_tokens(tokens, ar_tokens)
                        row["lossless_vs_ar"] = not row["mismatches_vs_ar"]
                doc["measured"].append(row)
                save()
                say(row_line(row))
                bar.update()
            del gen
            gc.collect()  # one config's weights and caches on the device at a time
        if v["cli"] is not None:
            def on_cli_row(cc: dict) -> None:
                doc["cli_check"] = cc
                save()
                row = cc["rows"][-1]
                say(f"[throughput] CLI {cc['label']} --batch-size {row['batch']}: "
                    + (f"failed: {row['error']}" if "error" in row else
                       f"{row['wall_s']:.1f}s wall, {row['tokens_per_s_wall']:.1f} tok/s, tokens equal "
                       f"{row['tokens_equal']}"))
                bar.update()

            cli_check(args, v["cli"], [tok.decode(list(p.ids)) for p in prompts], batches, out, on_cli_row,
                      status=bar.set_postfix_str)
    finally:
        bar.close()


if __name__ == "__main__":
    sys.exit(cli_main(main, prog="bench throughput"))
