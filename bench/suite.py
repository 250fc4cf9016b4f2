"""The benchmark matrix: AR, DFlash and DDTree on the same prompts, timed, checked and summarised.

    configs  = ar, dflash, then ddtree x policies x budgets (AR always runs: it is the baseline)
    for each config (one Generator), for each temperature:
        one warm-up generation (compilation happens before the clock anyway),
        `repeats` timed passes over all prompts (batch 1, seed = seed + prompt index),
        one profiled pass (`profile=True`) over the first `profile_prompts` prompts for the
        per-stage times.

Speedups are against AR measured in the same run at the same temperature. Greedy runs are
checked token by token against AR's output (lossless decoding must reproduce it exactly).

Compilation is most of a short run's wall time. Executables are shared wherever the programs
are the same (the prefill of configs that differ in the tree alone, the profiled stages of
configs that read the same spec fields; `Executables`, `profile.stage_functions`), and with
`compile_workers` > 1 every row's executables are compiled up front, that many rows at a time
in threads, before anything is timed (`compile_ahead`). Each row records where its wall time
went (`row_timing`), and `deadline` stops the matrix cleanly before a row that would not fit.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import gc
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


def git_commit(root: Path) -> dict:
    """The checkout's commit and whether tracked files differ from it. DDTREE_COMMIT overrides
    both (device copies of a repo can carry a stale .git: pass the local commit with the command,
    e.g. `DDTREE_COMMIT=$(git rev-parse --short HEAD) bash bench/sessions/gpu_next_c.sh` typed here)."""
    if os.environ.get("DDTREE_COMMIT"):
        return {"commit": os.environ["DDTREE_COMMIT"], "dirty": None}

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


def environment() -> dict:
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
    env.update(git_commit(Path(__file__).resolve().parent.parent))
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


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token (or the shorter length when one is a prefix); None if equal."""
    if list(a) == list(b):
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


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
                     drafter_quant="none" if cfg.method == "ar" else opts.drafter_quant, executables=executables)


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
