"""Merge suite runs made in several calls (device time limits) into one bench.json, summary and plots.

    python -m bench merge RUN_DIR_1 RUN_DIR_2 [...] --out DIR

Each input is a `python -m bench suite` output directory (a partial one too). They must share the
checkpoint, prompts, dtype, lengths and device; rows are keyed by (label, temperature), and a
row that appears twice is an error. Every speedup was computed against the AR of its own run,
so each run must have measured AR at its temperatures (the suite always runs AR first).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ddtree_jax.errors import ArgumentParser, UserError, cli_main, read_json_file

# config fields that must agree for rows to be comparable
SAME = ("ckpt", "dtype", "prompts", "data", "num_prompts", "prompt_tokens", "max_new_tokens", "top_k", "top_p",
        "seed", "attn_impl", "matmul_impl", "cache_impl", "drafter_quant", "batch_size")


def load(path: Path) -> dict:
    return read_json_file(path / "bench.json", missing="give directories written by python -m bench --out")


def merge(benches: list[dict], names: list[str]) -> dict:
    first = benches[0]
    for b, name in zip(benches[1:], names[1:]):
        for key in SAME:
            if b["config"].get(key) != first["config"].get(key):
                raise UserError(f"{name}: config {key} = {b['config'].get(key)!r} differs from "
                                f"{names[0]}'s {first['config'].get(key)!r}; only runs of one setting merge")
        if b["environment"].get("device_kind") != first["environment"].get("device_kind"):
            raise UserError(f"{name} ran on {b['environment'].get('device_kind')}, {names[0]} on "
                            f"{first['environment'].get('device_kind')}; merge runs of one device")
    rows, seen = [], {}
    for b, name in zip(benches, names):
        for r in b["runs"]:
            key = (r["label"], r["temperature"])
            if key in seen:
                raise UserError(f"{r['label']} at temperature {r['temperature']:g} is in both {seen[key]} and {name}")
            seen[key] = name
            rows.append(r)
    merged = json.loads(json.dumps(first))  # a deep copy
    merged["runs"] = rows
    merged["all_lossless"] = all(r["lossless"] is not False for r in rows)
    merged["mismatches"] = [m for b in benches for m in b.get("mismatches", [])]
    merged["merged_from"] = [dict(dir=n, commit=b["environment"].get("commit"), date=b["environment"].get("date"),
                                  rows=len(b["runs"]), partial=b.get("partial")) for b, n in zip(benches, names)]
    merged.pop("partial", None)
    for part in ("torch_baseline", "round_latency"):
        found = [b[part] for b in benches if part in b]
        if found:
            merged[part] = found[-1]
        else:
            merged.pop(part, None)
    for key in ("methods", "policies", "budgets", "temperatures"):
        vals = []
        for b in benches:
            vals += [v for v in b["config"].get(key, []) if v not in vals]
        merged["config"][key] = vals
    return merged


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m bench merge", description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="output directories of python -m bench")
    ap.add_argument("--out", required=True)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if len(args.runs) < 2:
        raise UserError("give at least two run directories to merge")
    benches = [load(Path(d)) for d in args.runs]
    merged = merge(benches, args.runs)
    from bench.suite import summary_markdown, write_json

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "bench.json", merged)
    table = summary_markdown(merged)
    (out / "summary.md").write_text(table)
    if not args.no_plots:
        from bench.plots import draw_all

        draw_all(merged, out)
    print(table, end="")
    return 0


if __name__ == "__main__":
    sys.exit(cli_main(main, prog="bench.merge"))
