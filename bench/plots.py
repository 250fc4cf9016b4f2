"""Plots of a bench.json (matplotlib, Agg): one figure per question, one panel per temperature.

    python -m bench.plots DIR/bench.json      # redraw the PNGs beside it

acceptance_vs_budget.png   mean acceptance per round vs budget, a line per tree policy, DFlash
                           (the chain) and AR as reference lines
speedup_vs_budget.png      tokens/s over AR's (same run, same temperature) vs budget
stage_breakdown.png        ms per round by stage (profiled pass), stacked, per config
acceptance_hist.png        fraction of rounds committing k tokens, per config
"""
from __future__ import annotations

import json
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


def draw_all(bench: dict, out_dir: str | Path) -> list[Path]:
    """The four PNGs in out_dir (none when the run has no rows, e.g. a --time-limit too short)."""
    out = Path(out_dir)
    rows = bench["runs"]
    if not rows:
        return []
    return [
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
        print("usage: python -m bench.plots DIR/bench.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    for p in draw_all(json.loads(path.read_text()), path.parent):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
