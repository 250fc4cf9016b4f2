"""Plots of a bench.json (matplotlib, Agg): one figure per question, one panel per temperature.

    python -m bench plots DIR/bench.json      # redraw the PNGs beside it

acceptance_vs_budget.png   mean acceptance per round vs budget, a line per tree policy, DFlash
                           (the chain) and AR as reference lines
speedup_vs_budget.png      tokens/s over AR's (same run, same temperature) vs budget
stage_breakdown.png        ms per round by stage (profiled pass), stacked, per config
acceptance_hist.png        fraction of rounds committing k tokens, per config
round_latency.png          (with --round-latency, or from a bench_round JSON) the large random-weight
                           model: ms per round by stage per config, the fused steady round
                           beside it, and the break-even acceptance (round / AR step)

    python -m bench plots DIR/round_qwen3-8b_auto.json    # bench.bench_round's JSON too

gemm_bandwidth.png         (bench.bench_gemm) weight-read TB/s per matmul shape, XLA's dot against
                           the best kernel config, one panel per row count
mgpu_prefix.png            (bench.bench_mgpu's mgpu.json) device us a call against the committed
                           prefix, a line per kernel config, one panel per tree size T, with the
                           prefix K/V bytes floor
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STAGES = ("draft", "tree", "verify", "walk", "commit")
COLORS = {"draft": "#4c72b0", "tree": "#dd8452", "verify": "#55a868", "walk": "#c44e52", "commit": "#8172b3"}


def _temps(rows):
    return sorted({r["temperature"] for r in rows})


def _temp_title(t: float) -> str:
    return "greedy" if t == 0 else f"temperature {t:g}"


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _panels(n, title):
    fig, axes = plt.subplots(1, n, figsize=(max(7.0, 5.6 * n), 4.2), squeeze=False)
    fig.suptitle(title)
    return fig, axes[0]


def _by_budget(rows, key, ylabel, title, path, ref_one=None):
    temps = _temps(rows)
    fig, axes = _panels(len(temps), title)
    for ax, t in zip(axes, temps):
        at = [r for r in rows if r["temperature"] == t]
        policies = sorted({r["policy"] for r in at if r["method"] == "ddtree"})
        budgets = sorted({r["budget"] for r in at if r["method"] == "ddtree"})
        for k, pol in enumerate(policies):  # markers and dashes differ: equal trees give equal lines
            pts = sorted((r["budget"], key(r)) for r in at if r["method"] == "ddtree" and r["policy"] == pol)
            ax.plot([b for b, _ in pts], [v for _, v in pts], marker="osD^v"[k % 5], ls=["-", "--", "-.", ":"][k % 4],
                    ms=7 - k, label=f"ddtree, policy {pol}")
        for r in at:
            if r["method"] == "dflash":
                ax.axhline(key(r), color="gray", ls="--", label=f"DFlash chain (B={r['budget']})")
        if ref_one is not None:
            ax.axhline(1.0, color="black", ls=":", lw=1, label=ref_one)
        if budgets:
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets, [str(b) for b in budgets])
            ax.minorticks_off()
        ax.set_xlabel("budget (draft nodes per round)")
        ax.set_ylabel(ylabel)
        ax.set_title(_temp_title(t))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def stage_breakdown(rows, path):
    temps = _temps([r for r in rows if r.get("stage_ms")]) or _temps(rows)
    fig, axes = _panels(len(temps), "ms per round by stage (profiled pass, each stage synced)")
    for ax, t in zip(axes, temps):
        at = [r for r in rows if r["temperature"] == t and r.get("stage_ms")]
        if not at:
            ax.text(0.5, 0.5, "no profiled pass (--profile-prompts 0)", ha="center", va="center",
                    transform=ax.transAxes)
        labels = [r["label"].replace("ddtree", "dd") for r in at]
        bottom = [0.0] * len(at)
        for s in STAGES:
            vals = [r["stage_ms"][s] for r in at]
            ax.bar(range(len(at)), vals, bottom=bottom, color=COLORS[s], label=s)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, r in enumerate(at):
            if r.get("overhead_fraction") is not None:
                ax.text(i, bottom[i], f"{100 * r['overhead_fraction']:.0f}%", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(at)), labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("ms per round (label: share beyond verify)")
        ax.set_title(_temp_title(t))
        if at:
            ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def acceptance_hist(rows, path):
    temps = _temps(rows)
    fig, axes = _panels(len(temps), "tokens committed per round (accepted + bonus)")
    for ax, t in zip(axes, temps):
        at = [r for r in rows if r["temperature"] == t and r["method"] != "ar" and sum(r.get("acceptance_histogram") or [])]
        policies = sorted({r["policy"] for r in at if r["method"] == "ddtree"})
        budgets = sorted({r["budget"] for r in at if r["method"] == "ddtree"})
        cmap = plt.get_cmap("viridis")
        for r in at:  # colour = budget, dashes = policy; DFlash in black
            h = r["acceptance_histogram"]
            total = sum(h)
            if r["method"] == "ddtree":
                color = cmap(0.15 + 0.7 * budgets.index(r["budget"]) / max(len(budgets) - 1, 1))
                ls = ["-", "--", "-.", ":"][policies.index(r["policy"]) % 4]
            else:
                color, ls = "black", "-"
            ax.step(range(1, len(h) + 1), [c / total for c in h], where="mid", color=color, ls=ls,
                    label=f"{r['label']} (mean {r['mean_acceptance']:.2f})")
        ax.set_xticks(range(1, max((len(r["acceptance_histogram"]) for r in at), default=1) + 1))
        ax.set_xlabel("tokens committed in the round")
        ax.set_ylabel("fraction of rounds")
        ax.set_title(_temp_title(t))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return _save(fig, path)


def _impls(r: dict, drafter: bool = True) -> str:
    """A row's kernel choice: its attention impl, its matmul and cache-write impls and drafter
    weights when not the defaults (drafter=False: without the drafter's, which AR has not)."""
    mm, kv, dq = r.get("matmul_impl", "auto"), r.get("cache_impl", "auto"), r.get("drafter_quant", "none")
    return (r.get("attn_impl", "") + ("" if mm == "auto" else f"/mm={mm}") + ("" if kv == "auto" else f"/kv={kv}")
            + ("" if dq == "none" or not drafter else f"/{dq} drafter"))


def _budget_key(budget) -> tuple[int, int]:
    """Fixed budgets ascending, then auto (bench round --budgets auto)."""
    return (1, 0) if budget == "auto" else (0, budget)


def round_latency(rl: dict, path):
    """Two panels from bench_round rows (or the suite's round_latency part): stacked stages (each
    timed alone) with the fused round beside them; the break-even acceptance per config."""
    order = {"ar": 0, "dflash": 1}
    rows = sorted((r for r in rl["rows"] if r.get("round_ms_median")),
                  key=lambda r: (order.get(r["method"], 2), *_budget_key(r.get("budget", 0))))
    settings = sorted({(r.get("prompt_len", 0), _impls(r)) for r in rows})
    rows.sort(key=lambda r: settings.index((r.get("prompt_len", 0), _impls(r))))
    labels = [("AR" if r["method"] == "ar" else "DFlash" if r["method"] == "dflash" else f"DDTree {r['budget']}")
              + (f" P{r.get('prompt_len')} {_impls(r)}" if len(settings) > 1 else "") for r in rows]
    fused = [r.get("round_ms_steady") or r["round_ms_median"] for r in rows]
    ar_of = {(r.get("prompt_len", 0), _impls(r, False)): f for r, f in zip(rows, fused) if r["method"] == "ar"}
    ar = [ar_of.get((r.get("prompt_len", 0), _impls(r, False))) for r in rows]
    title = (f"{rl.get('model', '?')}-shaped random weights, prompt {rows[0].get('prompt_len', rl.get('prompt_len', '?'))}"
             f" ({rl.get('device', '?')}, {rl.get('attn_impl', 'auto')})") if rows else "no rows"
    fig, axes = _panels(2, title)
    ax = axes[0]
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    staged = [r for r in rows if r.get("stage_ms")]
    for s in STAGES:
        vals = [(r.get("stage_ms") or {}).get(s, 0.0) for r in rows]
        if any(vals):
            ax.bar([i - 0.2 for i in x], vals, width=0.4, bottom=bottom, color=COLORS[s], label=f"{s} (alone)")
            bottom = [b + v for b, v in zip(bottom, vals)]
    verify = [r.get("verify_ms_steady") if not r.get("stage_ms") else None for r in rows]
    if any(verify):  # no stages, the verify alone: it and the rest of the round (issue 6's overhead)
        ax.bar([i - 0.2 for i in x], [v or 0.0 for v in verify], width=0.4, color=COLORS["verify"],
               label="verify pass alone (device loop)")
        rest = [f - v if v else 0.0 for f, v in zip(fused, verify)]
        ax.bar([i - 0.2 for i in x], rest, width=0.4, bottom=[v or 0.0 for v in verify], color="#bbbbbb",
               label="beyond the verify")
        for i, (v, f) in enumerate(zip(verify, fused)):
            if v:
                ax.text(i - 0.2, f, f"{100 * (f - v) / f:.0f}%", ha="center", va="bottom", fontsize=7)
    ax.bar([i + 0.2 for i in x], fused, width=0.4, color="black", label="fused round (steady)")
    for i, f in enumerate(fused):
        ax.text(i + 0.2, f, f"{f:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ms per round")
    how = {r.get("stage_timing") for r in staged}
    ax.set_title("stages, each alone in a device loop, vs the fused round" if how == {"device loop"}
                 else "stages, each jitted and synced alone, vs the fused round" if staged
                 else "the verify pass alone vs the fused round" if any(verify) else "the fused round")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    if any(ar):
        even = [f / a if a else 0.0 for f, a in zip(fused, ar)]
        ax.bar(list(x), even, color="#55a868")
        for i, e in enumerate(even):
            ax.text(i, e, f"{e:.2f}" if e else "no AR", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="black", ls=":", lw=1)
    ax.set_xticks(list(x), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tokens per round to match AR")
    ax.set_title("break-even acceptance (round / AR step)")
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def time_us(r: dict) -> float:
    """The figure a bench_gemm row is ranked by: its device time per call where traced, else its wall."""
    d = r.get("device_us")
    return d if d is not None and math.isfinite(d) else r["wall_us"]


def gemm_bandwidth(result: dict, path):
    """bench_gemm's rows: achieved weight-read TB/s per shape, XLA's dot against the best kernel
    config, one panel per row count, with the HBM copy rates as reference lines."""
    rows = result["rows"]
    ms = sorted({r["m"] for r in rows}, key=lambda m: (m != 65, -m))  # the DDTree-64 verify first
    fig, axes = _panels(len(ms) or 1, f"skinny matmuls, weight read rate ({result.get('device', '?')})")
    for ax, m in zip(axes, ms):
        shapes = sorted({r["shape"] for r in rows if r["m"] == m})
        xla, ker = [], []
        for sh in shapes:
            mine = [r for r in rows if r["m"] == m and r["shape"] == sh]
            wb = lambda r: r["floor_us"] * 3.3 / max(time_us(r), 1e-9)  # noqa: E731  weight TB/s
            xla.append(max((wb(r) for r in mine if r["variant"] == "xla"), default=0.0))
            ker.append(max((wb(r) for r in mine if r.get("config")), default=0.0))
        x = range(len(shapes))
        ax.bar([i - 0.2 for i in x], xla, width=0.4, label="XLA dot")
        ax.bar([i + 0.2 for i in x], ker, width=0.4, label="kernel, best config")
        for ref, name in ((3.3, "JAX copy 3.3 TB/s"), (4.3, "PyTorch copy 4.3 TB/s")):
            ax.axhline(ref, color="gray", ls=":", lw=1)
            ax.text(len(shapes) - 0.5, ref, name, ha="right", va="bottom", fontsize=7, color="gray")
        ax.set_xticks(list(x), shapes, rotation=30, ha="right")
        ax.set_ylabel("weight bytes / device time (TB/s; wall where untraced)")
        ax.set_title(f"{m} rows")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def is_mgpu_rows(data) -> bool:
    """Whether `data` is bench_mgpu's mgpu.json: a list of rows with t, prefix and config."""
    return (isinstance(data, list) and bool(data)
            and all(isinstance(r, dict) and {"t", "prefix", "config"} <= set(r) for r in data))


MGPU_HEADS = (32, 8, 128)  # bench_mgpu's shape (Qwen3-8B): query heads, kv heads, head dim


def mgpu_prefix(rows: list, path, itemsize: int = 2, tb_s: float = 3.3):
    """bench_mgpu's rows: device us a call (busy) against the prefix, a line per config (failed
    rows left out), one panel per T, with the bytes floor of reading the prefix's K and V once
    (bench_mgpu's heads; at tb_s TB/s)."""
    ts = sorted({r["t"] for r in rows})
    fig, axes = _panels(len(ts), "verify attention alone: device time against the committed prefix")
    _, hkv, dh = MGPU_HEADS
    for ax, t in zip(axes, ts):
        mine = [r for r in rows if r["t"] == t]
        prefixes = sorted({r["prefix"] for r in mine})
        for name in dict.fromkeys(r["config"] for r in mine):
            pts = sorted((r["prefix"], r["busy_us"]) for r in mine
                         if r["config"] == name and r.get("busy_us") is not None)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        floor = [p * 2 * hkv * dh * itemsize / (tb_s * 1e6) for p in prefixes]
        ax.plot(prefixes, floor, color="gray", ls=":", label=f"K/V bytes floor ({tb_s:g} TB/s)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("committed prefix (tokens)")
        ax.set_ylabel("device us a call")
        ax.set_title(f"T = {t}")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _save(fig, path)


def draw_all(bench: dict, out_dir: str | Path) -> list[Path]:
    """The four PNGs in out_dir (none when the run has no rows, e.g. a --time-limit too short),
    plus round_latency.png when the run has a round-latency part."""
    out = Path(out_dir)
    rows = bench["runs"]
    extra = [round_latency(bench["round_latency"], out / "round_latency.png")] if bench.get("round_latency") else []
    if not rows:
        return extra
    return extra + [
        _by_budget(rows, lambda r: r["mean_acceptance"], "mean tokens per round",
                   "acceptance vs budget", out / "acceptance_vs_budget.png", ref_one="AR (1 token)"),
        _by_budget(rows, lambda r: r["speedup_vs_ar"], "speedup over AR (tokens/s)",
                   f"speedup vs budget ({bench['environment']['device_kind']})", out / "speedup_vs_budget.png",
                   ref_one="AR"),
        stage_breakdown(rows, out / "stage_breakdown.png"),
        acceptance_hist(rows, out / "acceptance_hist.png"),
    ]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m bench plots DIR/bench.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        print(f"bench.plots: cannot read {path} as JSON ({type(e).__name__}); give a bench.json, a "
              "bench_round, a bench_gemm or a bench_mgpu JSON", file=sys.stderr)
        return 2
    if is_mgpu_rows(data):  # a bench.bench_mgpu mgpu.json
        print(mgpu_prefix(data, path.parent / "mgpu_prefix.png"))
        return 0
    if not isinstance(data, dict) or ("runs" not in data and "rows" not in data):
        print(f"bench.plots: {path} is neither a bench.json (runs), a bench_round JSON (rows) nor a "
              "bench_mgpu mgpu.json (a list of rows)", file=sys.stderr)
        return 2
    if "runs" not in data and data["rows"] and "variant" in data["rows"][0]:  # a bench.bench_gemm JSON
        print(gemm_bandwidth(data, path.parent / "gemm_bandwidth.png"))
        return 0
    if "runs" not in data and "rows" in data:  # a bench.bench_round JSON
        print(round_latency(data, path.parent / "round_latency.png"))
        return 0
    for p in draw_all(data, path.parent):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
