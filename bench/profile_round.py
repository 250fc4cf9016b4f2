"""Where a round's time goes: device kernels per stage from a profiler trace of the fused loop.

    python -m bench profile --model qwen3-8b --methods ar,ddtree:64 --out DIR   # GPU
    python -m bench profile --model tiny --methods ar,ddtree:16 --rounds 2        # CPU smoke

Runs `engine.run_rounds` (the on-device while_loop) under `jax.profiler.trace`, reads the trace
back with `jax.profiler.ProfileData`, and attributes every device kernel to its round stage
(draft / tree / verify / walk / commit, from the `jax.named_scope`s the engine sets, through the
compiled HLO's op metadata; kernels without it, cuBLAS's and Pallas', take the stage of the
tagged kernels around them when those agree). Per method it reports wall time per round,
kernel-busy time per round (the union of kernel intervals: the rest is launch gaps and host
sync), kernels per round, and per stage and per kernel kind (matmul, attention, fusion, ...)
and per stage and target-layer part (the attn / gdn / moe / mlp scopes) their time and count. DIR gets
profile_<model>.json and, per method, the optimized HLO text (hlo_<method>.txt.xz).

While the profiler traces, XLA runs its command buffers (CUDA graphs) op by op, one launch a
kernel, unless the executable was compiled with xla_enable_command_buffers_during_profiling. So
by default the trace shows the op-by-op execution, whose gaps (launch latency, a host that falls
behind small kernels) are not the graphs'. `--graphs` compiles the round with that option, so
that the trace is of the graphs that unprofiled runs execute (XLA calls the option experimental).
"""
from __future__ import annotations

import argparse
import bisect
import collections
import glob
import json
import lzma
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from bench.bench_round import SHAPES, build, fused_times, set_mem_fraction, setup_request, xla_options
from ddtree_jax import engine
from ddtree_jax.cost import parse_budgets
from ddtree_jax.generator import Generator

STAGES = ("draft", "tree", "verify", "walk", "commit")
PARTS = ("attn", "gdn", "moe", "mlp")  # the target layers' scopes (models/target.py, models/hybrid.py)
_META = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name="([^"]*)"')
_DEDUP = re.compile(r'deduplicated_name="([^"]*)"')


def op_scopes(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> the op_name metadata (named-scope path) of that instruction.

    Kernel names are keys too (instruction or deduplicated name with '.' -> '_'): inside a
    command buffer the trace names the buffer as the op, and only the kernel name is left.
    """
    out = {}
    for line in hlo_text.splitlines():
        m = _META.match(line)
        if m:
            out.setdefault(m.group(1), m.group(2))
            out.setdefault(m.group(1).replace(".", "_"), m.group(2))
            d = _DEDUP.search(line)
            if d:
                out.setdefault(d.group(1).replace(".", "_"), m.group(2))
    return out


def stage_of(op_name: str, names: tuple[str, ...] = STAGES) -> str:
    """The first of `names` that is a segment of the named-scope path op_name, else "other"."""
    parts = op_name.split("/")
    for s in names:
        if s in parts:
            return s
    return "other"


def kind_of(kernel: str, hlo_op: str) -> str:
    k = (kernel + " " + hlo_op).lower()
    if any(x in k for x in ("gemm", "gemv", "cublas", "nvjet", "matmul", "dot", "cutlass", "sm90_xmma")):
        return "matmul"
    if any(x in k for x in ("attention", "pallas", "tree_attn", "triton_attn")):
        return "attention"
    if "dynamic-update-slice" in k or "dynamic_update_slice" in k:
        return "cache-write"
    if any(x in k for x in ("topk", "top_k", "sort", "select_and_scatter")):
        return "topk/sort"
    if "memcpy" in k or "memset" in k or "copy" in k:
        return "copy"
    if "reduce" in k:
        return "reduce"
    return "fusion/other"


def device_events(xspace_path: str) -> list[dict]:
    """Kernel-like events (name, start_ns, dur_ns, hlo_op) from the device planes of a trace.

    GPU: every event on a "/device:GPU:*" plane's stream lines. CPU (smoke runs): the thunk
    events of the PjRt CPU client, the closest thing to device kernels there.
    """
    data = jax.profiler.ProfileData.from_file(xspace_path)
    gpu, cpu = [], []
    for plane in data.planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if not line.name.lower().startswith("stream"):
                    continue
                for e in line.events:
                    st = dict(e.stats)
                    gpu.append(dict(name=e.name, start=e.start_ns, dur=e.duration_ns,
                                    hlo_op=str(st.get("hlo_op", "")), line=line.name))
        elif plane.name == "/host:CPU":
            for line in plane.lines:
                if "PjRtCpuClient" not in line.name:
                    continue
                for e in line.events:
                    st = dict(e.stats)
                    if "hlo_op" in st:
                        cpu.append(dict(name=e.name, start=e.start_ns, dur=e.duration_ns,
                                        hlo_op=str(st["hlo_op"]), line=line.name))
    return gpu or cpu


def host_in_gaps(xspace_path: str, events: list[dict], rounds: int, top: int = 16) -> list[dict]:
    """What the host does while the device idles > 50 us (the loop's predicate round trip, graph
    launches): every host event (all threads of /host:CPU) that starts inside such a gap, with
    its overlap summed by thread and name, ms per round, largest first. Events begun before the
    gap (the call, the while thunk) are left out; nested ones that start in it (the command
    buffer's execute and its cuGraphLaunch) each count their own overlap."""
    gaps, end = [], events[0]["start"] if events else 0
    for e in events:
        if e["start"] - end > 5e4:
            gaps.append((end, e["start"]))
        end = max(end, e["start"] + e["dur"])
    if not gaps:
        return []
    data = jax.profiler.ProfileData.from_file(xspace_path)
    acc = collections.defaultdict(lambda: [0.0, 0])
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for e in line.events:
                a, b = e.start_ns, e.start_ns + e.duration_ns
                i = bisect.bisect_right(gaps, (b, b)) - 1
                while i >= 0 and gaps[i][1] > a:
                    lap = min(b, gaps[i][1]) - a
                    if lap > 0 and a >= gaps[i][0]:
                        k = (line.name[:24], e.name[:80])
                        acc[k][0] += lap
                        acc[k][1] += 1
                    i -= 1
    rows = sorted(acc.items(), key=lambda kv: -kv[1][0])[:top]
    return [dict(thread=k[0], name=k[1], ms_per_round=v[0] / 1e6 / rounds, count_per_round=v[1] / rounds)
            for k, v in rows]


def traced_events(run) -> list[dict]:
    """The device events (`device_events`) of one call of run() under the profiler."""
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            run()
        paths = sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))
        return device_events(paths[-1]) if paths else []


def kernel_summary(events: list[dict], calls: int) -> dict:
    """Per call of a traced run of `calls` calls (us): every kernel name's device time (largest
    first), their sum, the launches and the span from the first kernel's start to the last
    one's end (kernels + the gaps between them). Empty for no events."""
    if not events:
        return {}
    per = collections.defaultdict(float)
    for e in events:
        per[e["name"]] += e["dur"] / 1e3 / calls
    span = (max(e["start"] + e["dur"] for e in events) - min(e["start"] for e in events)) / 1e3
    return dict(kernels_us=dict(sorted(per.items(), key=lambda kv: -kv[1])), busy_us=sum(per.values()),
                span_us=span / calls, launches=len(events) / calls)


def op_of(event: dict, scopes: dict[str, str]) -> str:
    """The HLO name to attribute a kernel event to: its op, or inside a command buffer (whose
    name is the op) or without metadata, the kernel's own name."""
    op = event["hlo_op"] or event["name"]
    return event["name"] if op not in scopes or op.startswith("command_buffer") else op


def busy_ns(events: list[dict]) -> float:
    """Length of the union of the events' intervals."""
    total, end = 0.0, -1.0
    for e in sorted(events, key=lambda e: e["start"]):
        s, t = e["start"], e["start"] + e["dur"]
        if t <= end:
            continue
        total += t - max(s, end)
        end = t
    return total


def infer_stages(stages: list[str]) -> tuple[list[str], int]:
    """Stages for kernels in time order, untagged ones ("other": cuBLAS and Pallas kernels carry
    no scope metadata) filled in where the nearest tagged kernels before and after them agree
    (a cuBLAS GEMM between two verify fusions is the verify's). Returns (stages, how many were
    filled). Kernels between two stages, or before the first / after the last tag, stay "other"."""
    out = list(stages)
    prev = [None] * len(out)
    last = None
    for i, s in enumerate(stages):
        if s != "other":
            last = s
        prev[i] = last
    filled, nxt = 0, None
    for i in range(len(out) - 1, -1, -1):
        if stages[i] != "other":
            nxt = stages[i]
        elif prev[i] is not None and prev[i] == nxt:
            out[i] = nxt
            filled += 1
    return out, filled


def summarize(events: list[dict], scopes: dict[str, str], rounds: int) -> dict:
    by_stage = collections.defaultdict(lambda: [0.0, 0])
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    by_op = collections.defaultdict(lambda: [0.0, 0, ""])
    events = sorted(events, key=lambda e: e["start"])
    names = [scopes.get(op_of(e, scopes), "") for e in events]
    stages, inferred = infer_stages([stage_of(n) for n in names])
    parts, _ = infer_stages([stage_of(n, PARTS) for n in names])
    by_part = collections.defaultdict(lambda: [0.0, 0])
    for e, st, pt in zip(events, stages, parts):
        op = op_of(e, scopes)
        scope = scopes.get(op, "") or f"({st}, by position)"
        kd = f"{st}:{kind_of(e['name'], op)}"
        for table, key in ((by_stage, st), (by_kind, kd), (by_part, f"{st}:{pt}")):
            table[key][0] += e["dur"]
            table[key][1] += 1
        by_op[op][0] += e["dur"]
        by_op[op][1] += 1
        by_op[op][2] = by_op[op][2] or f"{e['name'][:60]} | {scope[-90:]}"
    per = lambda ns: ns / 1e6 / rounds  # noqa: E731  ms per round
    # idle gaps between consecutive kernels, bucketed: small ones are launch latency inside a
    # graph, large ones host round-trips (loop predicate, relaunch)
    gaps = {"<5us": 0.0, "5-50us": 0.0, ">50us": 0.0}
    # the idle under 50 us in front of each kernel, by kernel name: which launches wait (a
    # cuBLASLt memset node once delayed every gate_up GEMM of the 8B round by 4.5 us)
    idle_before = collections.defaultdict(lambda: [0.0, 0])
    end = events[0]["start"] if events else 0
    n_big = 0
    for e in events:
        g = e["start"] - end
        if g > 0:
            b = "<5us" if g < 5e3 else "5-50us" if g < 5e4 else ">50us"
            gaps[b] += g
            n_big += b == ">50us"
            if g < 5e4:
                idle_before[e["name"][:48]][0] += g
                idle_before[e["name"][:48]][1] += 1
        end = max(end, e["start"] + e["dur"])
    idle_top = sorted(idle_before.items(), key=lambda kv: -kv[1][0])[:10]
    t0 = events[0]["start"] if events else 0
    timeline = [(e["name"][:48], round((e["start"] - t0) / 1e3, 2), round(e["dur"] / 1e3, 2), st)
                for e, st in zip(events[:4000], stages)]
    top = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:40]
    return {
        "kernels_per_round": len(events) / rounds,
        "kernel_sum_ms_per_round": per(sum(e["dur"] for e in events)),
        "busy_ms_per_round": per(busy_ns(events)),
        "stages_ms": {k: per(v[0]) for k, v in sorted(by_stage.items())},
        "stages_kernels": {k: v[1] / rounds for k, v in sorted(by_stage.items())},
        "stage_inferred_kernels_per_round": inferred / rounds,
        "kinds_ms": {k: per(v[0]) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][0])},
        "kinds_kernels": {k: v[1] / rounds for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1][0])},
        "parts_ms": {k: per(v[0]) for k, v in sorted(by_part.items(), key=lambda kv: -kv[1][0])},
        "parts_kernels": {k: v[1] / rounds for k, v in sorted(by_part.items(), key=lambda kv: -kv[1][0])},
        "gaps_ms_per_round": {k: per(v) for k, v in gaps.items()},
        "gaps_over_50us_per_round": n_big / rounds,
        "idle_before_ms_per_round": {k: per(v[0]) for k, v in idle_top},
        "idle_before_count_per_round": {k: v[1] / rounds for k, v in idle_top},
        "timeline": timeline,
        "top_ops": [dict(op=k, ms_per_round=per(v[0]), count_per_round=v[1] / rounds, what=v[2]) for k, v in top],
    }


GRAPHS_OPTION = "xla_enable_command_buffers_during_profiling"


def profile_one(gen: Generator, prompt_len: int, rounds: int, out: Path | None, label: str,
                graphs: bool = False) -> dict:
    req = setup_request(gen, prompt_len, rounds * 40 + 8)
    spec, static, knobs = req.spec, req.static, req.knobs
    fresh_state = req.refill  # as generate: each call's prefill into the last call's buffers

    state = jax.block_until_ready(fresh_state())
    t0 = time.perf_counter()
    lowered = engine.run_rounds.lower(gen.tparams, gen.dparams, state, knobs, jnp.int32(rounds), **static)
    run = lowered.compile(compiler_options={**gen.round_options(spec), **({GRAPHS_OPTION: True} if graphs else {})})
    compile_s = time.perf_counter() - t0
    hlo = run.as_text() or ""
    if out is not None:
        with lzma.open(out / f"hlo_{label}.txt.xz", "wt") as f:
            f.write(hlo)
    scopes = op_scopes(hlo)
    # timed runs (per call and steady state), then a traced run
    kept = []
    walls, steady = fused_times(gen, run, fresh_state, knobs, rounds, 3, keep=kept)
    wall = sorted(walls)[1]
    state = jax.block_until_ready(fresh_state(kept.pop()))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp):
            st = run(gen.tparams, gen.dparams, state, knobs, gen.rounds_limit(rounds))
            jax.block_until_ready(st.out)
        paths = sorted(glob.glob(f"{tmp}/**/*.xplane.pb", recursive=True))
        events = device_events(paths[-1]) if paths else []
        n = max(int(st.rounds[0]), 1)
        host = host_in_gaps(paths[-1], sorted(events, key=lambda e: e["start"]), n) if events else []
        if out is not None and paths:  # the raw trace, for what the summary leaves out
            with open(paths[-1], "rb") as f, lzma.open(out / f"trace_{label}.xplane.pb.xz", "wb") as g:
                shutil.copyfileobj(f, g)
    res = summarize(events, scopes, n) if events else {}
    res.update(host_in_gaps=host, label=label, wall_ms_per_round=wall, wall_ms_all=walls,
               steady_ms_per_round=sorted(steady)[1], steady_ms_all=steady, compile_s=compile_s, unroll=spec.unroll,
               rounds=n, hlo_instructions=hlo.count("\n"), traced="graphs" if graphs else "op by op")
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench profile", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--methods", default="ar,dflash,ddtree:64",
                    help="comma-separated METHOD[:BUDGET][/UNROLL], e.g. ar/1,ar/4,ddtree:64,ddtree:auto (unroll 0 or "
                         "none: the default)")
    ap.add_argument("--cost-model", default=None, metavar="FILE", help="ddtree:auto's cost model (default: the shipped one)")
    ap.add_argument("--auto-budgets", default=None, help="the budgets ddtree:auto chooses among, comma-separated")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--attn-impl", default="auto")
    ap.add_argument("--matmul-impl", default="auto")
    ap.add_argument("--cache-impl", default="auto")
    ap.add_argument("--xla-option", action="append", default=None, metavar="KEY=VALUE",
                    help="XLA option for the executables (repeatable), e.g. xla_gpu_enable_command_buffer=")
    ap.add_argument("--graphs", action="store_true",
                    help=f"trace the command buffers as they run unprofiled ({GRAPHS_OPTION}); default: "
                         "op by op, as XLA runs them under a profiler")
    ap.add_argument("--deterministic", action="store_true",
                    help="the deterministic mode's kernels (Generator's deterministic=True)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    set_mem_fraction(args.model)
    ck = build(args.model, jnp.dtype(args.dtype))
    results = []
    for m in [x for x in args.methods.split(",") if x]:
        m, _, u = m.partition("/")
        method, _, b = m.partition(":")
        opts = xla_options(args.xla_option)
        auto = {} if b != "auto" else {"cost_model": args.cost_model, **(
            {"auto_budgets": tuple(parse_budgets(args.auto_budgets))} if args.auto_budgets else {})}
        gen = Generator(ck, method=method, budget=b if b == "auto" else int(b or 64), attn_impl=args.attn_impl,
                        unroll=int(u or 0), compiler_options=opts, matmul_impl=args.matmul_impl,
                        cache_impl=args.cache_impl, deterministic=args.deterministic, **auto)
        label = f"{method}{b}_u{gen.unroll}{'_det' * args.deterministic}"
        r = profile_one(gen, args.prompt_len, args.rounds, out, label, graphs=args.graphs)
        results.append(r)
        print(f"[profile] {label}: wall {r['wall_ms_per_round']:.3f} ms/round, steady {r['steady_ms_per_round']:.3f} (compile {r['compile_s']:.0f}s), busy {r.get('busy_ms_per_round', 0):.3f}, "
              f"kernel sum {r.get('kernel_sum_ms_per_round', 0):.3f}, {r.get('kernels_per_round', 0):.0f} kernels/round, "
              f"traced {r['traced']}", flush=True)
        print(f"    gaps ms/round: {r.get('gaps_ms_per_round')} ({r.get('gaps_over_50us_per_round', 0):.1f} over 50us); "
              f"{r.get('stage_inferred_kernels_per_round', 0):.0f} kernels/round without scope took the stage around them")
        for k, v in list(r.get("idle_before_ms_per_round", {}).items())[:6]:
            print(f"    idle  {v:8.3f} ms in front of {r['idle_before_count_per_round'][k]:6.1f} x {k}")
        for k, v in r.get("stages_ms", {}).items():
            print(f"    stage {k:8s} {v:8.3f} ms  {r['stages_kernels'][k]:7.1f} kernels")
        for k, v in list(r.get("kinds_ms", {}).items())[:14]:
            print(f"    kind  {k:28s} {v:8.3f} ms  {r['kinds_kernels'][k]:7.1f} kernels")
        for k, v in list(r.get("parts_ms", {}).items())[:10]:
            print(f"    part  {k:28s} {v:8.3f} ms  {r['parts_kernels'][k]:7.1f} kernels")
        for h in r.get("host_in_gaps", [])[:10]:
            print(f"    host in gaps {h['ms_per_round']:7.3f} ms x{h['count_per_round']:6.1f} {h['thread']:24s} {h['name']}")
        for t in r.get("top_ops", [])[:12]:
            print(f"    op {t['ms_per_round']:7.3f} ms x{t['count_per_round']:5.1f} {t['op'][:40]:40s} {t['what']}")
        if out:
            (out / f"profile_{args.model}.json").write_text(json.dumps(
                dict(model=args.model, prompt_len=args.prompt_len, device=jax.devices()[0].device_kind,
                     jax=jax.__version__, results=results), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
