"""Inside the Mosaic GPU verify-attention kernel: where a CTA's warpgroups spend their cycles.

    python -m bench.profile_mgpu --ts 264 --prefixes 512 --configs 64x3w2s,64x4w2ks \
        --out bench/results/profile_mgpu

Runs the kernel (ddtree_jax/kernels/tree_attention_mgpu.py) on the bench_mgpu case (Qwen3-8B's
heads, a random tree, bf16) with Mosaic GPU's in-kernel profiler on (``profile_dir``): every
warpgroup of every CTA records the start and end of the kernel's named scopes (``q``,
``wait_k``, ``qk``, ``softmax``, ``wait_v``, ``pv``, ``skip``, ``merge``, ``store``; the memory
warpgroup ``loads``, ``drain``) by its SM's cycle counter, and each CTA's start by the global
timer. Reported per config: CTAs, SMs used and CTAs on the busiest SM (waves), the spread of
CTA starts, a CTA's cycles first event to last, and per scope the cycles a compute warpgroup
spends in it (mean over warpgroups) with its count, so that a key step's cost splits into
waits, products and softmax. GPU only (the profiler is part of the CUDA lowering). Writes
profile_mgpu.json and each config's raw trace (trace_T_P_CONFIG.json.xz) under --out.
"""
from __future__ import annotations

import argparse
import glob
import json
import lzma
import os
import sys
import tempfile
from collections import defaultdict


def summarize_trace(trace: dict, *, warpgroups: int, compute_wgs: int, clock_ghz: float) -> dict:
    """Summary of one Mosaic GPU profiler trace (its Chrome-trace JSON).

    The profiler writes one track (tid) per warpgroup of each CTA, ``tid = 1 + wg + warpgroups *
    cta``, on the SM's track (``pid = 1 + SM``); an event's ``ts`` (us) is the CTA's global-timer
    start (ns) plus the SM cycles since the track's first event, over 1e3. So starts compare
    across CTAs in ns, and durations inside a track are cycles. Warpgroups ``< compute_wgs``
    compute; the one after them loads. clock_ghz converts cycles to us for the span."""
    tracks: dict[int, list] = defaultdict(list)
    sm_of: dict[int, int] = {}
    for ev in trace["traceEvents"]:
        tracks[int(ev["tid"])].append(ev)
        sm_of[int(ev["tid"])] = int(ev["pid"]) - 1
    ctas: dict[int, dict] = {}
    scopes = {"compute": defaultdict(lambda: [0, 0.0]), "memory": defaultdict(lambda: [0, 0.0])}
    role_tracks = {"compute": 0, "memory": 0}
    role_cycles = {"compute": 0.0, "memory": 0.0}
    for tid, evs in tracks.items():
        cta, wg = divmod(tid - 1, warpgroups)
        role = "compute" if wg < compute_wgs else "memory"
        start_ns = evs[0]["ts"] * 1e3
        cycles = [(e["ts"] * 1e3 - start_ns) for e in evs]
        length = cycles[-1] - cycles[0]
        info = ctas.setdefault(cta, {"sm": sm_of[tid], "start_ns": start_ns, "cycles": 0.0})
        info["start_ns"] = min(info["start_ns"], start_ns)
        info["cycles"] = max(info["cycles"], length)
        role_tracks[role] += 1
        role_cycles[role] += length
        stack = []
        for e, cyc in zip(evs, cycles):
            if e["ph"] == "B":
                stack.append((e["name"], cyc))
            elif stack:
                name, begin = stack.pop()
                if not stack:                      # top-level ranges only: no double counting
                    acc = scopes[role][name]
                    acc[0] += 1
                    acc[1] += cyc - begin
    per_sm = defaultdict(int)
    for info in ctas.values():
        per_sm[info["sm"]] += 1
    # The starts are the global timer's low 32 bits: unwrap a wrap inside the kernel.
    low = [info["start_ns"] for info in ctas.values()]
    if low and max(low) - min(low) > 2**31:
        for info in ctas.values():
            if info["start_ns"] < 2**31:
                info["start_ns"] += 2**32
    starts = sorted(info["start_ns"] for info in ctas.values())
    t0 = starts[0] if starts else 0.0
    ends_us = [(info["start_ns"] - t0) / 1e3 + info["cycles"] / (clock_ghz * 1e3) for info in ctas.values()]
    out = {
        "ctas": len(ctas), "sms": len(per_sm), "max_ctas_per_sm": max(per_sm.values(), default=0),
        "start_spread_us": (starts[-1] - t0) / 1e3 if starts else 0.0,
        "span_us": max(ends_us, default=0.0),
        "cta_cycles_mean": sum(i["cycles"] for i in ctas.values()) / max(len(ctas), 1),
        "cta_cycles_max": max((i["cycles"] for i in ctas.values()), default=0.0),
    }
    for role in ("compute", "memory"):
        n = max(role_tracks[role], 1)
        total = role_cycles[role] / n
        rows = {name: {"count": c / n, "cycles": cyc / n, "each": cyc / max(c, 1)}
                for name, (c, cyc) in sorted(scopes[role].items(), key=lambda kv: -kv[1][1])}
        inside = sum(r["cycles"] for r in rows.values())
        out[role] = {"tracks": role_tracks[role], "cycles": total, "scopes": rows,
                     "outside_scopes": total - inside}
    return out


def format_summary(name: str, s: dict) -> str:
    lines = [f"{name}: {s['ctas']} CTAs on {s['sms']} SMs (at most {s['max_ctas_per_sm']} an SM), "
             f"starts spread {s['start_spread_us']:.2f} us, span {s['span_us']:.2f} us, "
             f"a CTA {s['cta_cycles_mean']:.0f} cycles (max {s['cta_cycles_max']:.0f})"]
    for role in ("compute", "memory"):
        r = s[role]
        lines.append(f"  {role} warpgroup: {r['cycles']:.0f} cycles, outside scopes {r['outside_scopes']:.0f}")
        for scope, row in r["scopes"].items():
            lines.append(f"    {scope:8s} {row['cycles']:8.0f} cycles  x{row['count']:5.2f}  "
                         f"{row['each']:7.0f} each")
    return "\n".join(lines)


def main(argv=None) -> int:
    import jax

    from bench.bench_kernels import int_list
    from bench.bench_mgpu import HEADS, timed_case
    from ddtree_jax.kernels.tree_attention_mgpu import attention_mgpu, parse_config

    ap = argparse.ArgumentParser(prog="python -m bench.profile_mgpu", description=__doc__.splitlines()[0])
    ap.add_argument("--ts", default="264", type=int_list)
    ap.add_argument("--prefixes", default="512", type=int_list)
    ap.add_argument("--configs", default="64x3w2s")
    ap.add_argument("--clock-ghz", type=float, default=1.98,
                    help="SM clock to turn a CTA's cycles into us (the H200's boost clock: 1.98)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if jax.devices()[0].platform not in ("gpu", "cuda"):
        ap.error("the in-kernel profiler needs a GPU (it is part of Mosaic GPU's CUDA lowering)")
    configs = {c: parse_config(c) for c in args.configs.split(",")}
    dh = HEADS[2]
    results = []
    for t in args.ts:
        for p in args.prefixes:
            case = timed_case(t, p)
            for name, cfg in configs.items():
                with tempfile.TemporaryDirectory() as tmp:
                    # The profiler names its file when the kernel is lowered, so only a compiled
                    # kernel's first call leaves a trace: warm the clocks and caches with the
                    # unprofiled kernel first, then run the profiled one once.
                    warm = jax.jit(lambda *a, cfg=cfg: attention_mgpu(*a, scale=dh**-0.5, config=cfg))
                    for _ in range(3):
                        jax.block_until_ready(warm(*case))
                    fn = jax.jit(lambda *a, cfg=cfg, tmp=tmp: attention_mgpu(
                        *a, scale=dh**-0.5, config=cfg, profile_dir=tmp))
                    jax.block_until_ready(fn(*case))
                    jax.effects_barrier()
                    files = sorted(glob.glob(os.path.join(tmp, "*trace.json")))
                    if not files:
                        print(f"T={t} prefix={p} {name}: no trace written", flush=True)
                        continue
                    with open(files[-1]) as f:
                        trace = json.load(f)
                s = summarize_trace(trace, warpgroups=cfg.compute_wgs + 1, compute_wgs=cfg.compute_wgs,
                                    clock_ghz=args.clock_ghz)
                s.update(t=t, prefix=p, config=name)
                results.append(s)
                print(format_summary(f"T={t} prefix={p} {name}", s), flush=True)
                if args.out:
                    os.makedirs(args.out, exist_ok=True)
                    with lzma.open(os.path.join(args.out, f"trace_{t}_{p}_{name}.json.xz"), "wt") as f:
                        json.dump(trace, f)
                    with open(os.path.join(args.out, "profile_mgpu.json"), "w") as f:
                        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
