"""Fit a verify-cost model (ddtree_jax.cost) from `bench round` JSON, or measure a grid and fit it.

    python -m bench fit-cost DIR/round_qwen3-8b_auto_b1_2_4.json [MORE.json ...] --out cost.json
    python -m bench fit-cost --measure --model qwen3-8b --out cost.json   # the grid on this GPU

The model keeps the measured rounds as they are (see ddtree_jax/cost.py for how it
interpolates); rounds measured twice are merged by their median. `--measure` runs `bench round`
over batches x (AR, DFlash, DDTree budgets) x prompt lengths (96 rows by default: one to two
hours at the 8B shape, each row a compile) and keeps its JSON beside --out.
"""
from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Sequence

from bench.projection import BATCHES, batch_list
from ddtree_jax.cost import METHODS, METRICS, CostModel, ModelSignature, Point
from ddtree_jax.errors import ArgumentParser, UserError, read_json_file

# the kernels, drafter and policy a model is fit for: what generate runs by default
DEFAULTS = {"attn_impl": "auto", "matmul_impl": "auto", "cache_impl": "auto", "drafter_quant": "none",
            "draft_vocab": None}
ROUND_HINT = "give a JSON that python -m bench round --out DIR wrote"


def signature(model: str, dtype: str, where: str) -> ModelSignature:
    """The shape of bench round's --model `model` at `dtype` (for a JSON that does not record it)."""
    import jax.numpy as jnp

    from bench.bench_round import SHAPES

    if model not in SHAPES:
        raise UserError(f"{where}: model {model!r} is not one of bench round's shapes ({', '.join(SHAPES)})")
    t, d, moe = SHAPES[model]["target"], SHAPES[model]["drafter"], SHAPES[model].get("moe", {})
    return ModelSignature(layers=t["num_layers"], hidden=t["hidden_size"], intermediate=t["intermediate_size"],
                          heads=t["num_heads"], kv_heads=t["num_kv_heads"], head_dim=t["head_dim"],
                          vocab=t["vocab_size"], dtype=jnp.dtype(dtype).name, drafter_layers=d["num_layers"],
                          block_size=d["block_size"], experts=moe.get("num_experts", 0), top_k=moe.get("top_k", 0),
                          expert_intermediate=moe.get("expert_intermediate", 0))


def _row_points(data: dict, where: str, metric: str) -> list[tuple[tuple, float]]:
    """((method, batch, nodes, prefix), ms) of every measured row of one bench round JSON."""
    key = "round_ms_median" if metric == "call" else "round_ms_steady"
    rows = data.get("rows")
    if not isinstance(rows, list):
        raise UserError(f"{where} has no list of \"rows\"; {ROUND_HINT}")
    out = []
    for i, r in enumerate(rows):
        fields = ("method", "batch", "nodes", "prompt_len", key)
        if not isinstance(r, dict) or any(f not in r for f in fields):
            raise UserError(f"{where}: rows[{i}] lacks one of {', '.join(fields)}; {ROUND_HINT}")
        if r.get("budget") == "auto":
            continue  # --budget auto mixes its candidates' costs: not one point of the model
        if r["method"] not in METHODS:
            raise UserError(f"{where}: rows[{i}] has method {r['method']!r}; bench round measures {', '.join(METHODS)}")
        for name, want in DEFAULTS.items():
            if r.get(name, want) != want:
                raise UserError(f"{where}: rows[{i}] was measured with {name}={r[name]!r}; a cost model is fit for "
                                f"generate's defaults: rerun bench round without that flag")
        if r["method"] == "ddtree" and r.get("policy", "ddtree") != "ddtree":
            raise UserError(f"{where}: rows[{i}] was measured with the {r['policy']!r} policy; fit the ddtree policy")
        ms = r[key]
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
            raise UserError(f"{where}: rows[{i}].{key} is {ms!r}; remeasure that row")
        out.append(((r["method"], int(r["batch"]), int(r["nodes"]), int(r["prompt_len"])), float(ms)))
    return out


def fit(runs: Sequence[tuple[str, dict]], metric: str = "call", source: str = "") -> CostModel:
    """A cost model from bench round outputs (name, parsed JSON) of one device, model and dtype;
    a round measured more than once counts by its median."""
    if metric not in METRICS:
        raise UserError(f"metric {metric!r}: choose one of {', '.join(METRICS)}")
    if not runs:
        raise UserError(f"no bench round JSON given; {ROUND_HINT}")
    first, times, sigs = None, {}, set()
    for where, data in runs:
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("device", "model", "dtype")):
            raise UserError(f"{where} lacks the strings device, model and dtype; {ROUND_HINT}")
        head = (data["device"], data["model"], data["dtype"])
        first = first or (where, head)
        if head != first[1]:
            raise UserError(f"{where} was measured on {' / '.join(head)}, {first[0]} on {' / '.join(first[1])}; "
                            f"fit one device, model and dtype at a time")
        if data.get("signature") is not None:
            try:
                sigs.add(ModelSignature(**data["signature"]))
            except TypeError:
                raise UserError(f"{where}: signature is {data['signature']!r}, not a model shape; "
                                f"{ROUND_HINT}") from None
            if len(sigs) > 1:
                raise UserError(f"{where} records another model shape than the files before it; fit one at a time")
        if data.get("errors"):
            print(f"[fit_cost] {where}: {len(data['errors'])} rows failed and are left out, e.g. "
                  f"{data['errors'][0][:200]}")
        for key, ms in _row_points(data, where, metric):
            times.setdefault(key, []).append(ms)
    if not times:
        raise UserError(f"{', '.join(w for w, _ in runs)}: no measured rows to fit; {ROUND_HINT}")
    device, model, dtype = first[1]
    points = tuple(Point(*key, round_ms=statistics.median(ms)) for key, ms in sorted(times.items()))
    where = ", ".join(w for w, _ in runs)
    try:
        return CostModel(device, sigs.pop() if sigs else signature(model, dtype, where), points, metric, source)
    except ValueError as e:
        raise UserError(f"{where}: {e}") from None


def measure(args) -> Path:
    """Run bench round over the grid of args; the path of the JSON it wrote."""
    from bench import bench_round

    raw = Path(args.raw or Path(args.out).parent)
    argv = ["--model", args.model, "--dtype", args.dtype, "--prompt-len", args.prompt_lens, "--methods", args.methods,
            "--budgets", args.budgets, "--batch", ",".join(map(str, args.batches)), "--rounds", str(args.rounds),
            "--repeats", str(args.repeats), "--stage-repeats", "0", "--out", str(raw)]
    print(f"[fit_cost] python -m bench round {' '.join(argv)}", flush=True)
    bench_round.main(argv)
    return raw / bench_round.output_name(args.model, "auto", args.batches)


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m bench fit-cost", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="bench round JSON files (one device, model and dtype)")
    ap.add_argument("--out", required=True, help="the cost model JSON to write")
    ap.add_argument("--metric", default="call", choices=METRICS,
                    help="call: ms a round of a 32-round call, as generate pays it; steady: of a long run")
    ap.add_argument("--source", default="", help="appended to the model's source note (e.g. the commit measured)")
    ap.add_argument("--measure", action="store_true", help="measure the grid below on this machine first")
    ap.add_argument("--model", default="qwen3-8b", help="bench round's --model")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batches", type=batch_list, default=list(BATCHES))
    ap.add_argument("--methods", default="ar,dflash,ddtree")
    ap.add_argument("--budgets", default="8,16,32,64,128,256", help="DDTree budgets")
    ap.add_argument("--prompt-lens", default="512,4096")
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--raw", default=None, help="where bench round's JSON goes (default: --out's folder)")
    args = ap.parse_args(argv)
    if args.measure == bool(args.files):
        ap.error("give bench round JSON files or --measure, not both or neither")
    paths = [measure(args)] if args.measure else [Path(p) for p in args.files]
    runs = [(str(p), read_json_file(p, missing=ROUND_HINT)) for p in paths]
    device = runs[0][1].get("device") if isinstance(runs[0][1], dict) else None
    note = f"python -m bench round ({', '.join(p.name for p in paths)}) on {device}"
    model = fit(runs, args.metric, f"{note}; {args.source}" if args.source else note)
    print(f"[fit_cost] {model.save(args.out)}: {model.device_kind}, {len(model.points)} points, covers:\n"
          f"{model.describe()}")
    return 0
