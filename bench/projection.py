"""Projected tokens/s against batch size: batch x acceptance / round time, from a cost model.

    python -m bench.projection --cost COST.json --acceptance ACC.json --out DIR

ACC.json gives tokens a round per row (the bonus token included), as the suite or the replay
reports them: {"dflash": 3.66, "64": 4.79, "auto": {"1": {"tokens": 4.9, "choices": {"64": 0.7,
"256": 0.3}}}}. Keys: "dflash", a DDTree budget, "auto"; AR is 1 token a round by definition.
`auto` is per batch size: its tokens a round and the share of rounds at each candidate it chose
(summing to 1), whose round times it pays. A method at a batch the cost model does not cover is
left out (null), never extrapolated.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

from ddtree_jax.cost import Candidate, CostModel, load_cost_model
from ddtree_jax.errors import ArgumentParser, ConfigError, UserError, read_json_file

BATCHES = (1, 2, 4, 8, 16, 32)


def batch_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (an argparse type: a bad list is a one-line usage error)."""
    batches = [int(b) for b in text.split(",") if b]
    if not batches or min(batches) < 1:
        raise ValueError(text)
    return batches


def label(candidate: Candidate | str) -> str:
    return {"ar": "AR", "dflash": "DFlash", "auto": "auto"}.get(candidate, f"DDTree-{candidate}")  # type: ignore


def _candidate(key: Any, where: str) -> Candidate:
    if key in ("ar", "dflash"):
        return key
    if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
        if int(key) >= 1:
            return int(key)
    raise UserError(f"{where}: {key!r} is not \"ar\", \"dflash\" or a DDTree budget >= 1")


def _tokens(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 1:
        raise UserError(f"{where} is {value!r}; tokens a round per row is a number >= 1 (the bonus token counts)")
    return float(value)


def parse_acceptance(obj: Any, where: str) -> tuple[dict[Candidate, float], dict[int, tuple[float, dict]]]:
    """(tokens a round per fixed candidate, {batch: (auto's tokens a round, {candidate: share})})."""
    if not isinstance(obj, dict):
        raise UserError(f"{where} holds {type(obj).__name__}, not an object of tokens a round by method")
    fixed: dict[Candidate, float] = {"ar": 1.0}
    auto: dict[int, tuple[float, dict]] = {}
    for key, value in obj.items():
        if key != "auto":
            fixed[_candidate(key, where)] = _tokens(value, f"{where}: {key}")
            continue
        if not isinstance(value, dict):
            raise UserError(f"{where}: auto must map a batch size to {{\"tokens\": T, \"choices\": {{...}}}}")
        for batch, run in value.items():
            at = f"{where}: auto.{batch}"
            if not str(batch).isdigit() or int(batch) < 1 or not isinstance(run, dict) \
                    or not isinstance(run.get("choices"), dict) or not run["choices"]:
                raise UserError(f"{at} must be a batch size >= 1 mapped to {{\"tokens\": T, \"choices\": {{...}}}}")
            shares = {_candidate(k, at): v for k, v in run["choices"].items()}
            if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 for v in shares.values()) \
                    or abs(sum(shares.values()) - 1) > 1e-6:
                raise UserError(f"{at}.choices are {run['choices']}; give each candidate's share of rounds, "
                                f"summing to 1")
            auto[int(batch)] = (_tokens(run.get("tokens"), f"{at}.tokens"), shares)
    return fixed, auto


def project(model: CostModel, acceptance: dict, batches: Sequence[int] = BATCHES, prefix: float = 512,
            where: str = "acceptance") -> dict:
    """Tokens/s of every method of `acceptance` at each batch size after `prefix` tokens: 1000 x
    batch x tokens a round / round ms (None where the model does not cover it)."""
    fixed, auto = parse_acceptance(acceptance, where)

    def ms(candidate: Candidate, batch: int) -> float | None:
        return model.round_ms(candidate, batch, prefix) if model.covers(candidate, batch) else None

    order = sorted(fixed, key=lambda c: (0, c == "dflash") if isinstance(c, str) else (1, c))
    series = {}
    for c in order:
        times = [ms(c, b) for b in batches]
        series[label(c)] = {"tokens": fixed[c], "round_ms": times,
                            "tokens_per_s": [None if t is None else 1e3 * b * fixed[c] / t
                                             for b, t in zip(batches, times)]}
    best = [max(((s["tokens_per_s"][i], name) for name, s in series.items() if s["tokens_per_s"][i] is not None),
                default=(None, None)) for i in range(len(batches))]
    out = {"device": model.device_kind, "prefix": prefix, "batches": list(batches), "series": series,
           "best": [name for _, name in best]}
    if auto:
        times, rates = [], []
        for b in batches:
            tokens, shares = auto.get(b, (None, {}))
            parts = [ms(c, b) for c in shares]
            t = None if tokens is None or None in parts else sum(s * p for s, p in zip(shares.values(), parts))
            times.append(t)
            rates.append(None if t is None else 1e3 * b * tokens / t)
        series["auto"] = {"tokens": {b: auto[b][0] for b in auto}, "round_ms": times, "tokens_per_s": rates}
        out["auto_over_best"] = [None if r is None or v is None else r / v for r, (v, _) in zip(rates, best)]
    return out


def table(proj: dict) -> str:
    """The projection as a markdown table: tokens/s by method (rows) and batch size (columns)."""
    head = "| method | " + " | ".join(f"batch {b}" for b in proj["batches"]) + " |"
    lines = [head, "|" + " --- |" * (len(proj["batches"]) + 1)]
    for name, s in proj["series"].items():
        lines.append(f"| {name} | " + " | ".join("-" if v is None else f"{v:.0f}" for v in s["tokens_per_s"]) + " |")
    if "auto_over_best" in proj:
        lines.append("| auto / best fixed | " + " | ".join("-" if v is None else f"{v:.3f}x"
                                                         for v in proj["auto_over_best"]) + " |")
    return "\n".join(lines)


def plot(proj: dict, path: str | Path) -> Path:
    """Tokens/s against batch size, one line per method (auto thick), to a PNG."""
    from bench.plots import _panels, _save

    fig, (ax,) = _panels(1, f"projected tokens/s, {proj['device']}, prefix {proj['prefix']}")
    for name, s in proj["series"].items():
        pts = [(b, v) for b, v in zip(proj["batches"], s["tokens_per_s"]) if v is not None]
        ax.plot([b for b, _ in pts], [v for _, v in pts], marker="o", label=name,
                **({"color": "black", "lw": 2.5} if name == "auto" else {}))
    ax.set_xscale("log", base=2)
    ax.set_xticks(proj["batches"], [str(b) for b in proj["batches"]])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s (projected)")
    ax.legend(fontsize=8)
    return _save(fig, Path(path))


def main(argv: Sequence[str] | None = None) -> int:
    ap = ArgumentParser(prog="python -m bench.projection", description=__doc__.splitlines()[0])
    ap.add_argument("--cost", required=True, help="a cost model JSON (python -m bench fit-cost)")
    ap.add_argument("--acceptance", required=True, help="tokens a round per method (see --help's description)")
    ap.add_argument("--batches", type=batch_list, default=list(BATCHES), help="batch sizes, comma-separated")
    ap.add_argument("--prefix", type=int, default=512, help="prefix length the round times are taken at")
    ap.add_argument("--out", required=True, help="directory for projection.json and projection.png")
    args = ap.parse_args(argv)
    model = load_cost_model(args.cost)
    acc = read_json_file(args.acceptance, missing="give tokens a round per method as JSON", error=ConfigError)
    proj = project(model, acc, args.batches, args.prefix, args.acceptance)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "projection.json").write_text(json.dumps(proj, indent=1))
    print(table(proj))
    print(f"[projection] {plot(proj, out / 'projection.png')}")
    return 0


if __name__ == "__main__":
    from ddtree_jax.errors import run_script

    run_script(main, "python -m bench.projection")
