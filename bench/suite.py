"""The suite: AR, DFlash and DDTree side by side on a checkpoint, timed, checked, summarised.

    python -m bench --out DIR                                  # the shipped pair (= python -m bench suite)
    python -m bench suite --ckpt DIR --num-prompts 16 --max-new-tokens 128 --budgets 16,64,256 \\
        --policies ddtree,beam:width=4 --temperatures 0,1.0 --repeats 3 --torch-baseline --out DIR
    python -m bench suite --round-latency qwen3-8b --out DIR   # + the round latency of the 8B shape (GPU)

Writes DIR/bench.json (config, environment, per-config and per-prompt figures), DIR/summary.md
(a markdown table) and PNG plots (bench/plots.py). Prompts: the shipped eval prompts
(bench/prompts.py) unless --data or --prompts say otherwise.

    configs  = ar, dflash, then ddtree x policies x budgets (AR always runs: it is the baseline)
    for each config (one Generator), for each temperature:
        one warm-up generation (compilation happens before the clock anyway),
        `repeats` timed passes over all prompts (batch 1, seed = seed + prompt index),
        one profiled pass (`profile=True`: `ddtree_jax.profile.profiled_rounds`) over the first
        `profile_prompts` prompts for the per-stage times.

Speedups are against AR measured in the same run at the same temperature. Greedy runs are
checked token by token against AR's output (lossless decoding must reproduce it exactly); a
mismatch is reported loudly and recorded (`lossless: false`).

Compilation is most of a short run's wall time. Executables are shared wherever the programs
are the same (the prefill of configs that differ in the tree alone, the profiled stages of
configs that read the same spec fields; `Executables`, `profile.stage_functions`), and with
--compile-workers N every row's executables are compiled up front, N rows at a time in threads,
before anything is timed. --time-limit S ends the run cleanly within S seconds (rows that would
not fit are skipped and listed, bench.json says "partial"), so that a `timeout` around the call
never has to kill it. Each row's `row_timing` says where its wall time went.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from bench.torch_baseline import first_mismatch
from ddtree_jax.errors import UserError, cli_main

STAGES = ("draft", "tree", "verify", "walk", "commit")
SCHEMA = "ddtree-jax-bench/1"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    method: str
    policy: str = "chain"
    budget: int = 0

    @property
    def label(self) -> str:
        if self.method == "ddtree":
            return f"ddtree[{self.policy}] B={self.budget}"
        return self.method


@dataclasses.dataclass
class SuiteOptions:
    max_new_tokens: int = 256
    temperatures: Sequence[float] = (0.0, 1.0)
    repeats: int = 3
    seed: int = 0
    top_k: int = 0
    top_p: float = 1.0
    stop_ids: Sequence[int] = ()
    profile_prompts: int = 4
    profile_temperatures: Sequence[float] | None = None  # None: all
    attn_impl: str = "auto"
    matmul_impl: str = "auto"
    cache_impl: str = "auto"
    drafter_quant: str = "none"  # the speculative rows' drafter weights (AR has none)
    compile_workers: int = 1  # > 1: compile every row's executables first, in that many threads
    verify_loop: bool = False  # also time each row's verify pass alone in a device loop (overhead_beyond_verify)
    deterministic: bool = False  # the Generator's deterministic kernels (a verify row = the one-row step, bitwise)


def matrix(methods: Sequence[str], policies: Sequence[str], budgets: Sequence[int]) -> list[RunConfig]:
    """AR first (the baseline of every speedup), then DFlash, then DDTree per policy and budget."""
    configs = [RunConfig("ar")]
    if "dflash" in methods:
        configs.append(RunConfig("dflash"))
    if "ddtree" in methods:
        configs += [RunConfig("ddtree", p, b) for p in policies for b in budgets]
    return configs


def spread(values: Sequence[float]) -> dict:
    values = [float(v) for v in values]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# ---------------------------------------------------------------------------------------------- environment


def git_commit(root: Path, commit: str | None = None) -> dict:
    """The checkout's commit and whether tracked files differ from it; `commit` (--commit) is taken
    as is where given: a copy of the tree without its .git (a device machine's) cannot tell."""
    if commit:
        return {"commit": commit, "dirty": None}

    def git(*args):
        # --no-optional-locks: never take the index lock (others may be running git in this checkout)
        r = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None

    try:
        commit = git("rev-parse", "--short", "HEAD")
        status = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def environment(commit: str | None = None) -> dict:
    import jax

    dev = jax.devices()[0]
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "jax": jax.__version__,
        "platform": jax.default_backend(),
        "device_kind": dev.device_kind,
        "device_count": jax.device_count(),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "cpu_count": os.cpu_count(),
        "numpy": np.__version__,
    }
    env.update(git_commit(Path(__file__).resolve().parent.parent, commit))
    return env


# ---------------------------------------------------------------------------------------------- compile accounting


class CompileMeter:
    """XLA compilations seen by JAX in this process (jax.monitoring), for per-row accounting.

    `compiles` counts backend compile requests (persistent-cache loads included, also counted in
    `cache_hits`); `seconds` sums their durations (threads compiling at once add up)."""

    _instance = None

    def __init__(self):
        self.compiles, self.cache_hits, self.seconds = 0, 0, 0.0
        self._lock = threading.Lock()

    @classmethod
    def get(cls) -> "CompileMeter":
        if cls._instance is None:
            from jax import monitoring

            meter = cls._instance = cls()
            monitoring.register_event_duration_secs_listener(meter._on_duration)
            monitoring.register_event_listener(meter._on_event)
        return cls._instance

    def _on_duration(self, event: str, duration: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            with self._lock:
                self.compiles += 1
                self.seconds += duration

    def _on_event(self, event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            with self._lock:
                self.cache_hits += 1

    def snapshot(self) -> tuple[int, int, float]:
        return self.compiles, self.cache_hits, self.seconds

    def since(self, snap: tuple[int, int, float]) -> dict:
        return {"compiles": self.compiles - snap[0], "cache_hits": self.cache_hits - snap[1],
                "compile_s": self.seconds - snap[2]}


# ---------------------------------------------------------------------------------------------- one config


def _nodes(gen) -> int:
    return gen.policy.num_nodes(gen.budget, gen.dcfg.depth) if gen.budget else 0


def _profiles(opts: SuiteOptions, temperature: float) -> int:
    if opts.profile_temperatures is not None and temperature not in opts.profile_temperatures:
        return 0
    return opts.profile_prompts


def _generate_kw(opts: SuiteOptions, temperature: float) -> dict:
    return dict(max_new_tokens=opts.max_new_tokens, temperature=temperature, top_k=opts.top_k, top_p=opts.top_p,
                stop_ids=list(opts.stop_ids))


def run_config(gen, prompts, temperature: float, opts: SuiteOptions, tick=lambda n=1: None) -> dict:
    """Time one Generator at one temperature over all prompts; returns the row (tokens kept aside
    under "_tokens" for the losslessness check, removed before writing)."""
    kw = _generate_kw(opts, temperature)
    meter = CompileMeter.get()
    snap, t0, cpu0 = meter.snapshot(), time.perf_counter(), time.process_time()
    gen.generate_ids([list(prompts[0].ids)], seed=opts.seed, **kw)  # warm-up (compiles, unless done ahead)
    tick()
    t1 = time.perf_counter()
    passes = []  # passes[r][i] = Result
    for _ in range(opts.repeats):
        row = []
        for p in prompts:
            row.append(gen.generate_ids([list(p.ids)], seed=opts.seed + p.index, **kw)[0])
            tick()
        passes.append(row)
    t2 = time.perf_counter()

    ref = passes[0]  # outputs are identical across repeats (same seed); timing is what repeats
    tokens = sum(r.num_output_tokens for r in ref)
    rounds = sum(r.rounds for r in ref)
    accept = [a for r in ref for a in r.acceptance_lengths]
    depth = gen.dcfg.depth if gen.budget else 0
    hist = np.bincount(np.asarray(accept, np.int64), minlength=depth + 2)[1:].tolist() if accept else []
    tps = [tokens / sum(r.time_s for r in ps) for ps in passes]
    decode = [sum(r.time_s - r.prefill_s for r in ps) for ps in passes]
    per_prompt = []
    for i, p in enumerate(prompts):
        times = [ps[i].time_s for ps in passes]
        r = ref[i]
        per_prompt.append({
            "prompt": p.index, "num_output_tokens": r.num_output_tokens, "rounds": r.rounds,
            "mean_acceptance": r.mean_acceptance, "time_s": spread(times),
            "tokens_per_s": r.num_output_tokens / statistics.median(times),
            "prefill_s": statistics.median(ps[i].prefill_s for ps in passes),
        })

    stage_ms, profiled_rounds = None, 0
    if _profiles(opts, temperature) > 0:
        totals = dict.fromkeys(STAGES, 0.0)
        for p in prompts[: _profiles(opts, temperature)]:
            r = gen.generate_ids([list(p.ids)], seed=opts.seed + p.index, profile=True, **kw)[0]
            for k in STAGES:
                totals[k] += (r.stage_ms or {}).get(k, 0.0) * r.rounds
            profiled_rounds += r.rounds
            tick()
        stage_ms = {k: v / max(profiled_rounds, 1) for k, v in totals.items()}
    round_ms = sum(stage_ms.values()) if stage_ms else None
    verify_ms = verify_alone_ms(gen, len(prompts[0].ids), temperature, opts) if opts.verify_loop else None
    per_round = [1e3 * d / max(rounds, 1) for d in decode]
    t3 = time.perf_counter()
    # where the row's wall time went (compile_s: inside any phase, the warm-up's and the profiled
    # pass's first calls; timed_s: the repeats, which never compile unless a prompt length does;
    # cpu_s: this process's CPU time, all threads)
    timing = {"row_s": t3 - t0, "warmup_s": t1 - t0, "timed_s": t2 - t1, "profile_s": t3 - t2,
              "timed_generate_s": sum(r.time_s for ps in passes for r in ps), "cpu_s": time.process_time() - cpu0,
              **meter.since(snap)}

    return {
        "method": gen.method, "policy": gen.policy_name, "budget": gen.budget, "nodes": _nodes(gen),
        "temperature": temperature, "label": RunConfig(gen.method, gen.policy_name, gen.budget).label,
        "num_prompts": len(prompts), "repeats": opts.repeats, "output_tokens": tokens, "rounds": rounds,
        "tokens_per_s": spread(tps),
        "decode_tokens_per_s": spread([tokens / d for d in decode]),
        "time_per_round_ms": spread(per_round),
        "prefill_ms": 1e3 * statistics.median(r.prefill_s for ps in passes for r in ps),
        "mean_acceptance": float(np.mean(accept)) if accept else 0.0,
        "acceptance_histogram": hist,  # hist[k] = rounds that committed k + 1 tokens
        "stage_ms": stage_ms, "profiled_rounds": profiled_rounds,
        "profiled_round_ms": round_ms,
        # what a round costs beyond the target's verify pass (draft, tree, walk, commit)
        "overhead_fraction": (round_ms - stage_ms["verify"]) / round_ms if round_ms else None,
        # the same from the fused rounds: 1 - the verify pass alone (a device loop) / the timed round
        "verify_alone_ms": verify_ms,
        "overhead_beyond_verify": 1 - verify_ms / statistics.median(per_round) if verify_ms else None,
        "per_prompt": per_prompt,
        "row_timing": timing,
        "_tokens": [r.token_ids for r in ref],
    }


def verify_alone_ms(gen, prompt_len: int, temperature: float, opts: SuiteOptions, rounds: int = 16,
                    repeats: int = 3) -> float:
    """The row's verify pass (target forward over root + tree, LM head, token choice) alone in a
    device loop after a prompt of prompt_len random tokens: bench_round.stage_loop_times."""
    from bench.bench_round import setup_request, stage_loop_times

    req = setup_request(gen, prompt_len, opts.max_new_tokens, temperature=temperature, top_k=opts.top_k,
                        top_p=opts.top_p)
    state = req.refill(None)
    times = stage_loop_times(gen, req.spec, state, req.knobs, rounds, repeats, only=("verify",))["verify"]
    return statistics.median(times)


def compare_with_baseline(row: dict, base: dict) -> None:
    """Speedup over AR (same prompts, same temperature) and, when greedy, the losslessness check."""
    row["speedup_vs_ar"] = row["tokens_per_s"]["median"] / base["tokens_per_s"]["median"]
    per = [p["tokens_per_s"] / b["tokens_per_s"] for p, b in zip(row["per_prompt"], base["per_prompt"])]
    row["speedup_vs_ar_per_prompt"] = spread(per)
    for p, s in zip(row["per_prompt"], per):
        p["speedup_vs_ar"] = s
    if row["temperature"] != 0:
        row["lossless"] = None  # sampled: same distribution, not the same tokens
        return
    bad = []
    for i, (ours, ref) in enumerate(zip(row["_tokens"], base["_tokens"])):
        at = first_mismatch(ours, ref)
        row["per_prompt"][i]["lossless"] = at is None
        if at is not None:
            row["per_prompt"][i]["first_mismatch"] = at
            bad.append({"prompt": row["per_prompt"][i]["prompt"], "first_mismatch": at,
                        "ours": ours[max(0, at - 2): at + 6], "ar": ref[max(0, at - 2): at + 6]})
    row["lossless"] = not bad
    row["mismatches"] = bad


# ---------------------------------------------------------------------------------------------- the suite


def make_generator(ckpt, cfg: RunConfig, opts: SuiteOptions, executables):
    """The Generator of one row, with the run's kernel choices and drafter weights."""
    from ddtree_jax.generator import Generator

    return Generator(ckpt, method=cfg.method, policy=cfg.policy, budget=cfg.budget or 1, attn_impl=opts.attn_impl,
                     matmul_impl=opts.matmul_impl, cache_impl=opts.cache_impl,
                     drafter_quant="none" if cfg.method == "ar" else opts.drafter_quant, executables=executables,
                     deterministic=opts.deterministic)


def compile_ahead(ckpt, prompts, configs: Sequence[RunConfig], opts: SuiteOptions, executables, *, log=print,
                  deadline: float | None = None) -> dict:
    """Compile every row's executables before anything is timed, `opts.compile_workers` rows at a
    time in threads (XLA compiles with the GIL released): each row's Generator generates once per
    prompt-length bucket and, where the row is profiled, runs one profiled generation per bucket
    of the profiled prompts (the stage functions compile on first use). The rows then find everything compiled. Returns the phase's
    figures; a row whose job would end after `deadline` (a time.perf_counter() value; judged by
    the longest job so far) is not started here and compiles in its turn. Rows that share a stage
    function may both compile it when they run side by side (JAX does not merge those)."""
    from concurrent.futures import ThreadPoolExecutor

    from ddtree_jax.generator import _bucket

    reps = {}  # one prompt per length bucket: shapes (and so executables) depend on the bucket only
    for p in prompts:
        reps.setdefault(_bucket(len(p.ids)), p)
    meter = CompileMeter.get()
    snap, t0 = meter.snapshot(), time.perf_counter()
    longest = [0.0]  # the longest job so far: a job that would end after the deadline is not started

    def job(cfg: RunConfig, t: float) -> bool:
        if deadline is not None and time.perf_counter() + longest[0] > deadline:
            return False
        t1 = time.perf_counter()
        gen = make_generator(ckpt, cfg, opts, executables)
        kw = _generate_kw(opts, t)
        for p in reps.values():
            gen.generate_ids([list(p.ids)], seed=opts.seed, **kw)
        profiled = {_bucket(len(p.ids)): p for p in reversed(prompts[:_profiles(opts, t)])}
        for p in profiled.values():
            gen.generate_ids([list(p.ids)], seed=opts.seed, profile=True, **kw)
        del gen
        longest[0] = max(longest[0], time.perf_counter() - t1)
        log(f"[bench] compiled {cfg.label} T={t:g} ({time.perf_counter() - t1:.1f}s; "
            f"{time.perf_counter() - t0:.0f}s into the compile phase)")
        return True

    # temperature-major: rows running side by side share fewer stage functions (not compiled twice)
    jobs = [(cfg, t) for t in opts.temperatures for cfg in configs]
    with ThreadPoolExecutor(max_workers=opts.compile_workers, thread_name_prefix="compile") as pool:
        done = list(pool.map(lambda j: job(*j), jobs))
    gc.collect()
    return {"workers": opts.compile_workers, "rows": sum(done), "of_rows": len(jobs),
            "wall_s": time.perf_counter() - t0, **meter.since(snap)}


def run_suite(ckpt, prompts, configs: Sequence[RunConfig], opts: SuiteOptions, *, progress: bool = True,
              log=print, on_row=None, deadline: float | None = None) -> dict:
    """All configs x temperatures. Returns {"rows": the rows in run order (AR first at each
    temperature), "reference": AR's output tokens per temperature (the reference for other
    comparisons), "skipped": labels of rows not run because the next row would have ended after
    `deadline` (a time.perf_counter() value; judged by the longest row so far), "compile_ahead":
    that phase's figures (compile_workers > 1) or None}. on_row(rows) is called after every row
    with the rows so far (without their token lists), to save partial results."""
    from tqdm import tqdm

    from ddtree_jax.generator import Executables

    executables = Executables()  # one prefill per cache size and sampling, whatever the tree
    ahead = None
    if opts.compile_workers > 1:
        ahead = compile_ahead(ckpt, prompts, configs, opts, executables, log=log, deadline=deadline)
        log(f"[bench] compile phase: {ahead['rows']}/{ahead['of_rows']} rows ready in {ahead['wall_s']:.1f}s "
            f"({ahead['compiles']} compiles, {ahead['cache_hits']} from the persistent cache, "
            f"{ahead['compile_s']:.1f}s of compile time on {opts.compile_workers} threads)")
    per_config = sum(1 + opts.repeats * len(prompts) + min(_profiles(opts, t), len(prompts))
                     for t in opts.temperatures)
    bar = tqdm(total=len(configs) * per_config, desc="bench", unit="gen",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    say = (lambda s: bar.write(s, file=sys.stderr)) if progress else log
    rows, baseline, skipped = [], {}, []
    longest = 0.0  # the longest row so far (Generator set-up included), to judge the next against the deadline

    def no_time() -> bool:  # once a row is skipped, every later one is too
        return bool(skipped) or (deadline is not None and time.perf_counter() + longest > deadline)

    try:
        for cfg in configs:
            if no_time():
                skipped += [f"{cfg.label} T={t:g}" for t in opts.temperatures]
                continue
            t_setup = time.perf_counter()
            gen = make_generator(ckpt, cfg, opts, executables)
            setup_s = time.perf_counter() - t_setup
            for t in opts.temperatures:
                if no_time():
                    skipped.append(f"{cfg.label} T={t:g}")
                    continue
                bar.set_postfix_str(f"{cfg.label} T={t:g}")
                row = run_config(gen, prompts, t, opts, tick=bar.update)
                row["row_timing"]["setup_s"], setup_s = setup_s, 0.0
                longest = max(longest, row["row_timing"]["row_s"] + row["row_timing"]["setup_s"])
                if cfg.method == "ar":
                    baseline[t] = row
                    row["lossless"] = True if t == 0 else None  # the reference itself
                compare_with_baseline(row, baseline[t])
                rows.append(row)
                say(summary_line(row))
                if on_row is not None:
                    on_row([{k: v for k, v in r.items() if k != "_tokens"} for r in rows])
                if row["lossless"] is False:
                    say(f"!!! LOSSLESS CHECK FAILED: {row['label']} T=0 differs from AR on "
                        f"{len(row['mismatches'])}/{len(prompts)} prompts: {row['mismatches'][:3]}")
            del gen
            gc.collect()  # one config's weights on the device at a time
    finally:
        bar.close()
    if skipped:
        say(f"[bench] time limit: {len(skipped)} rows not run ({', '.join(skipped)})")
    reference = {t: row["_tokens"] for t, row in baseline.items()}
    for row in rows:
        row.pop("_tokens", None)
    return {"rows": rows, "reference": reference, "skipped": skipped, "compile_ahead": ahead}


def summary_line(row: dict) -> str:
    tps = row["tokens_per_s"]
    st = ""
    if row["stage_ms"]:
        st = " | ms/round " + " ".join(f"{k} {row['stage_ms'][k]:.1f}" for k in STAGES if row["stage_ms"][k])
    ok = {True: "lossless", False: "MISMATCH", None: "sampled"}[row["lossless"]]
    tm = row.get("row_timing")
    wall = ""
    if tm:
        wall = (f" | row {tm['row_s'] + tm.get('setup_s', 0):.1f}s: compile {tm['compile_s']:.1f}s "
                f"({tm['compiles']}), warm-up {tm['warmup_s']:.1f}s, timed {tm['timed_s']:.1f}s, "
                f"profile {tm['profile_s']:.1f}s")
    return (f"[bench] {row['label']:<24} T={row['temperature']:<4g} acc {row['mean_acceptance']:5.2f}  "
            f"{tps['median']:8.1f} tok/s [{tps['min']:.1f}-{tps['max']:.1f}]  x{row['speedup_vs_ar']:.2f} vs AR  "
            f"{ok}{st}{wall}")


def markdown_table(rows: Sequence[dict]) -> str:
    head = ("| method | policy | budget | nodes | temperature | mean acceptance | tokens/s (median [min-max]) "
            "| speedup vs AR | round ms (profiled) | overhead beyond verify (profiled) "
            "| round ms (timed) | verify alone ms | beyond verify (fused) | lossless |")
    lines = [head, "| " + " | ".join(["---"] * (head.count("|") - 1)) + " |"]
    for r in rows:
        tps = r["tokens_per_s"]
        ok = {True: "yes", False: "**NO**", None: "n/a (sampled)"}[r["lossless"]]
        rnd = f"{r['profiled_round_ms']:.1f}" if r["profiled_round_ms"] else "-"
        ov = f"{100 * r['overhead_fraction']:.0f}%" if r["overhead_fraction"] is not None else "-"
        timed = f"{r['time_per_round_ms']['median']:.2f}" if r.get("time_per_round_ms") else "-"
        va = f"{r['verify_alone_ms']:.2f}" if r.get("verify_alone_ms") else "-"
        fo = f"{100 * r['overhead_beyond_verify']:.0f}%" if r.get("overhead_beyond_verify") is not None else "-"
        lines.append(f"| {r['method']} | {r['policy'] if r['method'] == 'ddtree' else '-'} | {r['budget']} | "
                     f"{r['nodes']} | {r['temperature']:g} | {r['mean_acceptance']:.2f} | "
                     f"{tps['median']:.1f} [{tps['min']:.1f}-{tps['max']:.1f}] | {r['speedup_vs_ar']:.2f} | "
                     f"{rnd} | {ov} | {timed} | {va} | {fo} | {ok} |")
    return "\n".join(lines) + "\n"


def summary_markdown(bench: dict) -> str:
    """summary.md: the runs table, then the PyTorch baseline and the round latency when present."""
    table = markdown_table(bench["runs"])
    if "torch_baseline" in bench:
        tb = bench["torch_baseline"]
        where = tb.get("device_name") if tb.get("device", "cpu") != "cpu" else f"CPU, {tb['threads']} threads"
        table += (f"\nPyTorch `transformers` {tb['transformers']} greedy generate (float32, {tb['cache_implementation']} "
                  f"cache, {where}): {tb['tokens_per_s']['median']:.1f} tok/s "
                  f"[{tb['tokens_per_s']['min']:.1f}-{tb['tokens_per_s']['max']:.1f}]")
        if tb.get("jax_ar_speedup_over_torch"):
            table += (f"; JAX AR greedy {tb['jax_ar_tokens_per_s']:.1f} tok/s "
                      f"({tb['jax_ar_speedup_over_torch']:.2f}x); tokens equal to JAX AR on {tb['equal_to_jax_ar']} prompts")
        table += "\n"
    if "round_latency" in bench:
        rl = bench["round_latency"]
        table += (f"\nRound latency, {rl['model']}-shaped random weights ({rl['dtype']}, prompt {rl['prompt_len']}, "
                  f"{rl['device']}; bench.bench_round):\n\n| method | policy | budget | nodes | round ms | "
                  + " | ".join(STAGES) + " |\n|" + " --- |" * (5 + len(STAGES)) + "\n")
        for r in rl["rows"]:
            table += (f"| {r['method']} | {r['policy']} | {r['budget']} | {r['nodes']} | {r['round_ms_median']:.2f} | "
                      + " | ".join(f"{r['stage_ms'].get(k, 0):.2f}" for k in STAGES) + " |\n")
    return table


# ---------------------------------------------------------------------------------------------- round latency


def round_latency(model: str, budgets: Sequence[int], policies: Sequence[str], repeats: int, prompt_len: int,
                  rounds: int = 32, attn_impl: str = "auto", log=print) -> dict:
    """bench.bench_round's measurement (random weights of a large shape) for AR, DFlash and DDTree."""
    import jax
    import jax.numpy as jnp

    from bench.bench_round import build, measure, nbytes
    from ddtree_jax.generator import Generator

    ck = build(model, jnp.bfloat16)
    runs = [("ar", "chain", 1), ("dflash", "chain", 1)] + [("ddtree", p, b) for p in policies for b in budgets]
    out_rows = []
    for method, policy, budget in runs:
        gen = Generator(ck, method=method, policy=policy, budget=budget, attn_impl=attn_impl)
        # every stage alone in a device loop: synced stage calls are host-bound on the large shapes
        r = measure(gen, prompt_len, rounds, repeats, stage_repeats=0, stage_loop=True)
        r.update(method=method, policy=gen.policy_name, budget=gen.budget)
        out_rows.append(r)
        beyond = 1 - r["verify_ms_steady"] / r["round_ms_steady"]
        log(f"[bench] round latency {model} {method:6s} {gen.policy_name:<12} B={gen.budget:<5d} "
            f"{r['round_ms_median']:.3f} ms/round, steady {r['round_ms_steady']:.3f}, "
            f"beyond the verify {100 * beyond:.0f} %")
        del gen
        gc.collect()
    return {"model": model, "prompt_len": prompt_len, "rounds": rounds, "dtype": "bfloat16", "attn_impl": attn_impl,
            "device": jax.devices()[0].device_kind, "target_bytes": nbytes(ck.target_params),
            "drafter_bytes": nbytes(ck.drafter_params), "rows": out_rows}


# ---------------------------------------------------------------------------------------------- command line


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

    ap = argparse.ArgumentParser(prog="python -m bench suite", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--ckpt", default=str(DEFAULT_CKPT), help="converted checkpoint (default: the shipped pair)")
    ap.add_argument("--prompts", help="prompt file (one per line, or JSONL with 'prompt'/'text') instead of the corpus")
    ap.add_argument("--data", default=str(default_data()),
                    help="corpus (JSONL[.xz]); prompts are the first --prompt-tokens tokens of its eval files "
                         "(default: the shipped eval prompts)")
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
    ap.add_argument("--deterministic", action="store_true",
                    help="every row with generate's --deterministic kernels: greedy rows equal AR's in bf16 too")
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
    ap.add_argument("--commit", default=None,
                    help="the commit to record (default: git's; a copy of the tree without .git cannot tell)")
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
    if args.deterministic:
        from ddtree_jax.generator import check_deterministic

        check_deterministic(args.attn_impl, args.matmul_impl, 1)
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
    deadline = None if args.time_limit is None else t_start + args.time_limit - FINISH_RESERVE_S

    from bench import prompts as P
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.cli import stop_ids_for
    from ddtree_jax.tokenizer import load_tokenizer

    configs = matrix(v["methods"], v["policies"], v["budgets"])
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

    opts = SuiteOptions(max_new_tokens=args.max_new_tokens, temperatures=v["temperatures"],
                        repeats=args.repeats, seed=args.seed, top_k=args.top_k, top_p=args.top_p,
                        stop_ids=stop, profile_prompts=min(args.profile_prompts, len(prompts)),
                        profile_temperatures=v["profile_temperatures"],
                        attn_impl=args.attn_impl, matmul_impl=args.matmul_impl, cache_impl=args.cache_impl,
                        drafter_quant=args.drafter_quant, compile_workers=args.compile_workers,
                        verify_loop=args.verify_loop, deterministic=args.deterministic)
    env = environment(args.commit)
    log(f"[bench] {len(configs)} configs x {len(opts.temperatures)} temperatures on {len(prompts)} prompts, "
        f"{args.repeats} repeats, {env['device_kind']} ({env['platform']}), commit {env['commit']}; "
        f"set-up {time.perf_counter() - t_start:.1f}s")

    def make_bench(rows: list[dict], partial: bool) -> dict:
        bench = {
            "schema": SCHEMA,
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
                "cache_impl": args.cache_impl, "drafter_quant": args.drafter_quant, "deterministic": args.deterministic,
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
        if not bench["all_lossless"] and dtype != "float32" and not args.deterministic:
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
    res = run_suite(ckpt, prompts, configs, opts, progress=not args.no_progress, log=log,
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
        bench["round_latency"] = round_latency(args.round_latency, v["budgets"], v["policies"][:1],
                                               args.repeats, args.prompt_tokens, attn_impl=args.attn_impl, log=log)
        write_json(out / "bench.json", bench)

    bench["wall_s"] = time.perf_counter() - t_start
    write_json(out / "bench.json", bench)
    table = summary_markdown(bench)
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
