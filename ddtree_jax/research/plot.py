"""Acceptance (tokens a round) against budget for every policy, from one record: a PNG and the same
numbers as CSV and JSON beside it."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Iterator, Sequence

from ddtree_jax.research.record import progress
from ddtree_jax.research.simulate import ranks_needed, replay
from ddtree_jax.research.store import Record, atomic_file
from ddtree_jax.trees import TreePolicy, available_policies, make_policy

FIELDS = ("policy", "budget", "mean_acceptance", "rounds", "mean_nodes")


def default_policies() -> list[str]:
    """Every registered policy that builds with its defaults (static needs its tree: give it)."""
    names = []
    for name in available_policies():
        try:
            make_policy(name)
        except ValueError:
            continue
        names.append(name)
    return names


def sweep(rec: Record, policies: Sequence[TreePolicy], budgets: Sequence[int], *, stop: bool = True
          ) -> tuple[list[dict], list[str]]:
    """(one row per policy and budget the record can replay exactly, a note per one it cannot)."""
    todo, notes = [], []
    for policy in policies:
        fits = [b for b in budgets if ranks_needed(policy, b, rec.depth) <= rec.top_k]
        if len(fits) < len(budgets):
            notes.append(f"{policy.spec}: budgets {', '.join(str(b) for b in budgets if b not in fits)} need more "
                         f"than the record's top-{rec.top_k}; left out")
        todo += [(policy, b) for b in fits]
    rows = []
    with progress(rec.num_prompts * rec.max_new_tokens * len(todo), "replay", "token") as bar:
        for policy, budget in todo:
            res = replay(rec, policy, budget, stop=stop, progress=bar)
            rows.append({"policy": res.policy, "budget": budget, "mean_acceptance": res.mean_acceptance,
                         "rounds": res.rounds, "mean_nodes": res.mean_nodes})
    return rows, notes


def write_plot(rec: Record, policies: Sequence[TreePolicy], budgets: Sequence[int], out: Path, *, stop: bool = True,
               title: str = "", force: bool = False) -> Iterator[str]:
    """Replay every policy at every budget, write OUT.png, OUT.csv and OUT.json (each atomically);
    yields a line per note and per file written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, notes = sweep(rec, policies, budgets, stop=stop)
    yield from notes
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == name]
        ax.plot([r["budget"] for r in mine], [r["mean_acceptance"] for r in mine], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget (draft nodes a round)")
    ax.set_ylabel("mean tokens a round")
    ax.set_title(f"greedy acceptance, {rec.num_prompts} prompts x {rec.max_new_tokens} tokens {title}".strip())
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120)
    plt.close(fig)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    meta = {"record": title, "checkpoint": rec.header["checkpoint"], "top_k": rec.top_k,
            "max_new_tokens": rec.max_new_tokens, "stop_at_eos": stop}
    for path, data in ((out, png.getvalue()), (out.with_suffix(".csv"), table.getvalue().encode()),
                       (out.with_suffix(".json"), (json.dumps({**meta, "rows": rows}, indent=1) + "\n").encode())):
        with atomic_file(path, force) as tmp:
            tmp.write_bytes(data)
        yield f"wrote {path}"
