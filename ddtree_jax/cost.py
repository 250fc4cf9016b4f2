"""Round time by device kind and model shape, and the choice of `--budget auto` from it.

A `CostModel` holds measured round times (ms) of one device kind and one model shape, as
`python -m bench round` measures them and `python -m bench fit-cost` writes them: points
(method, batch, nodes, prefix) -> ms, where a round verifies batch x (nodes + 1) rows (AR: 0
nodes and no draft; DFlash: the chain, block size - 1 nodes; DDTree: the budget). Between them:

- prefix length: each (method, batch, nodes)'s least-squares line over its measured prefixes,
  slope floored at 0; below the smallest prefix measured anywhere in the model, clamped to it;
  above the largest, extrapolated linearly (the one extrapolation: attention's reads grow
  linearly with the keys, the rest of a round does not move). A point measured at one prefix
  is flat in prefix.
- DDTree budget: piecewise linear in verify rows between the budgets measured at a batch;
  outside them, refused (past the largest measured budget a verify pass changes regime).
- batch: piecewise linear between measured batches; outside them, refused.
- monotone: non-decreasing in rows and in batch (each value is raised to the one before it), so
  noise between two measurements cannot make a larger verify look cheaper.

`choose_budget` picks, for one round of a whole batch (a verify pass has one static shape), the
candidate that maximises expected tokens per ms: a row's expected tokens at DDTree budget n are
1 + the sum of the path probabilities of its best n nodes (DDTree's objective). It is plain
array code over `xp` (jax.numpy inside jit; numpy for offline replay: `choose_budget_np`,
`budget_picker`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

import jax.numpy as jnp
import numpy as np

from ddtree_jax.errors import ConfigError, read_json_file

FORMAT = "ddtree-cost-model"
VERSION = 1
METHODS = ("ar", "dflash", "ddtree")
METRICS = ("call", "steady")  # ms a round of one 32-round call (as generate pays it), or of a long run
SHIPPED_DIR = Path(__file__).resolve().parent / "cost_models"
REFIT = "python -m bench fit-cost --measure --out FILE"
Candidate = int | str  # "ar", "dflash", or a DDTree budget >= 1


MOE_FIELDS = ("experts", "top_k", "expert_intermediate")


@dataclasses.dataclass(frozen=True)
class ModelSignature:
    """What a round's cost depends on besides batch, rows and prefix: the target's and the
    drafter's shapes and the dtype. Two models with equal signatures cost the same per round."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype: str
    drafter_layers: int
    block_size: int
    # a mixture-of-experts target's experts (0: dense); a file without them is for a dense target
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0

    @classmethod
    def of(cls, tcfg: Any, dcfg: Any, dtype: Any) -> "ModelSignature":
        """From a TargetConfig, a DrafterConfig and the compute dtype (read by attribute: this
        module imports no model code)."""
        moe = getattr(tcfg, "moe", None)
        return cls(layers=tcfg.num_layers, hidden=tcfg.hidden_size, intermediate=tcfg.intermediate_size,
                   heads=tcfg.num_heads, kv_heads=tcfg.num_kv_heads, head_dim=tcfg.head_dim,
                   vocab=tcfg.vocab_size, dtype=jnp.dtype(dtype).name, drafter_layers=dcfg.num_layers,
                   block_size=dcfg.block_size, experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
                   expert_intermediate=moe.expert_intermediate if moe else 0)

    def to_json(self) -> dict:
        """The fields, the MoE ones only for an MoE target (a dense model's file reads as before)."""
        d = dataclasses.asdict(self)
        return d if self.experts else {k: v for k, v in d.items() if k not in MOE_FIELDS}

    def differences(self, other: "ModelSignature") -> str:
        """'layers 36 against 28, ...': the fields where self differs from other ('' if none)."""
        return ", ".join(f"{f.name} {getattr(self, f.name)} against {getattr(other, f.name)}"
                         for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name))


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured round: `method` at `batch` rows of `nodes` draft nodes each, after a prompt of
    `prefix` tokens, took `round_ms`."""

    method: str
    batch: int
    nodes: int
    prefix: int
    round_ms: float


@dataclasses.dataclass(frozen=True)
class CostLines:
    """The cost of each candidate at one batch as a line in the prefix length, for use inside jit:
    `at(prefix)` -> float32[K] ms a round. Hashable: it is static configuration of a round
    (engine.DecodeSpec.auto)."""

    candidates: tuple[Candidate, ...]
    at_min: tuple[float, ...]  # ms at min_prefix
    slope: tuple[float, ...]  # ms per prefix token above min_prefix
    min_prefix: float

    def at(self, prefix, xp=jnp):
        """ms a round of each candidate after `prefix` tokens (a scalar: the rows' mean length)."""
        extra = xp.maximum(xp.asarray(prefix, xp.float32) - np.float32(self.min_prefix), 0)
        return xp.asarray(np.asarray(self.at_min, np.float32)) + xp.asarray(np.asarray(self.slope, np.float32)) * extra


@dataclasses.dataclass(frozen=True)
class CostModel:
    """Measured round times of one device kind and model shape (see the module docstring for how
    it interpolates and what it refuses). Construct through `from_json`/`load_cost_model` or with
    `points`; bad points raise ValueError."""

    device_kind: str
    model: ModelSignature
    points: tuple[Point, ...]
    metric: str = "call"
    source: str = ""
    # (method, batch) -> (nodes ascending, ms at min_prefix, slope): the monotone envelope
    _curves: dict = dataclasses.field(init=False, repr=False, compare=False)
    _min_prefix: int = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not self.points:
            raise ValueError("it has no points; measure at least one round")
        if self.metric not in METRICS:
            raise ValueError(f"metric is {self.metric!r}; it must be one of {', '.join(METRICS)}")
        seen = set()
        for i, p in enumerate(self.points):
            key = (p.method, p.batch, p.nodes, p.prefix)
            if key in seen:
                raise ValueError(f"point {i} repeats method {p.method}, batch {p.batch}, nodes {p.nodes}, "
                                 f"prefix {p.prefix}; keep one measurement of each")
            seen.add(key)
            want = {"ar": 0, "dflash": self.model.block_size - 1}.get(p.method)
            if want is not None and p.nodes != want:
                raise ValueError(f"point {i} ({p.method}) has nodes {p.nodes}; {p.method} verifies {want} "
                                 f"nodes at block size {self.model.block_size}")
        object.__setattr__(self, "_min_prefix", min(p.prefix for p in self.points))
        lines: dict[tuple[str, int, int], list[Point]] = {}
        for p in self.points:
            lines.setdefault((p.method, p.batch, p.nodes), []).append(p)
        curves: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for (method, batch) in sorted({k[:2] for k in lines}):
            nodes = sorted(k[2] for k in lines if k[:2] == (method, batch))
            fits = [self._line(lines[(method, batch, n)]) for n in nodes]
            at_min = np.maximum.accumulate([f[0] for f in fits])  # non-decreasing in rows
            slope = np.maximum.accumulate([f[1] for f in fits])
            if at_min[0] <= 0:
                raise ValueError(f"{method} at batch {batch}, nodes {nodes[0]}: its measured times fall so "
                                 f"steeply with the prefix that the line is {at_min[0]:.3f} ms at prefix "
                                 f"{self._min_prefix}; remeasure it")
            curves[(method, batch)] = (np.asarray(nodes), at_min, slope)
        object.__setattr__(self, "_curves", curves)

    def _line(self, pts: list[Point]) -> tuple[float, float]:
        """(ms at the model's smallest prefix, slope >= 0) of a least-squares line over pts."""
        x = np.asarray([p.prefix for p in pts], np.float64)
        y = np.asarray([p.round_ms for p in pts], np.float64)
        slope = 0.0
        if len(pts) > 1:
            slope = max(float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2)), 0.0)
        return float(y.mean() + slope * (self._min_prefix - x.mean())), slope

    # -- queries --------------------------------------------------------------------------------

    def _at_batch(self, method: str, nodes: int, batch: int) -> tuple[float, float] | None:
        """(ms at min prefix, slope) of `method` with `nodes` at a measured batch, or None."""
        curve = self._curves.get((method, batch))
        if curve is None or not curve[0][0] <= nodes <= curve[0][-1]:
            return None
        xs, at_min, slope = curve
        return float(np.interp(nodes, xs, at_min)), float(np.interp(nodes, xs, slope))

    def _line_for(self, candidate: Candidate, batch: int) -> tuple[float, float]:
        method, nodes = _method_nodes(candidate, self.model.block_size)
        covering = [(b, v) for b in sorted(b for m, b in self._curves if m == method)
                    if (v := self._at_batch(method, nodes, b)) is not None]
        lo = [(b, v) for b, v in covering if b <= batch]
        hi = [(b, v) for b, v in covering if b >= batch]
        if not lo or not hi:
            raise ConfigError(f"the {self.device_kind} cost model does not cover {_label(candidate)} at batch "
                              f"{batch} (it covers: {self.describe(one_line=True)}); refit it over that "
                              f"batch and budget: {REFIT}")
        at_min = np.maximum.accumulate([v[0] for _, v in covering])  # non-decreasing in batch
        slope = np.maximum.accumulate([v[1] for _, v in covering])
        bs = [b for b, _ in covering]
        return float(np.interp(batch, bs, at_min)), float(np.interp(batch, bs, slope))

    def covers(self, candidate: Candidate, batch: int) -> bool:
        try:
            self._line_for(candidate, batch)
        except ConfigError:
            return False
        return True

    def round_ms(self, candidate: Candidate, batch: int, prefix: float) -> float:
        """ms a round of `candidate` ("ar", "dflash" or a DDTree budget) at `batch` after `prefix`
        tokens; ConfigError where the model does not cover it."""
        return float(self.lines((candidate,), batch).at(prefix, xp=np)[0])

    def lines(self, candidates: Sequence[Candidate], batch: int) -> CostLines:
        """Every candidate's cost at `batch` as a line in the prefix (ConfigError for one not covered)."""
        cands = check_candidates(candidates)
        fits = [self._line_for(c, batch) for c in cands]
        return CostLines(cands, tuple(float(np.float32(f[0])) for f in fits),
                         tuple(float(np.float32(f[1])) for f in fits), float(self._min_prefix))

    def candidates(self, batch: int) -> tuple[Candidate, ...]:
        """"ar", "dflash" and the measured DDTree budgets that the model covers at `batch`."""
        budgets = sorted({p.nodes for p in self.points if p.method == "ddtree"})
        return tuple(c for c in ("ar", "dflash", *budgets) if self.covers(c, batch))

    def coverage(self) -> dict[str, dict[int, dict[str, list[int]]]]:
        """method -> batch -> {"nodes": measured node counts, "prefix": measured prefix lengths}."""
        out: dict[str, dict[int, dict[str, list[int]]]] = {}
        for p in self.points:
            c = out.setdefault(p.method, {}).setdefault(p.batch, {"nodes": [], "prefix": []})
            c["nodes"] = sorted(set(c["nodes"]) | {p.nodes})
            c["prefix"] = sorted(set(c["prefix"]) | {p.prefix})
        return {m: dict(sorted(out[m].items())) for m in METHODS if m in out}

    def describe(self, one_line: bool = False) -> str:
        """What the model covers, one line per method (or all on one line)."""
        parts = []
        for method, batches in self.coverage().items():
            for batch, c in batches.items():
                nodes = (f" budgets {c['nodes'][0]}..{c['nodes'][-1]} (measured {', '.join(map(str, c['nodes']))})"
                         if method == "ddtree" else "")
                pre = (f"prefix {c['prefix'][0]}..{c['prefix'][-1]}" if len(c["prefix"]) > 1
                       else f"prefix {c['prefix'][0]} only (flat in prefix)")
                parts.append(f"{method} batch {batch}:{nodes} {pre}")
        return "; ".join(parts) if one_line else "\n".join(parts)

    # -- files ----------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "device_kind": self.device_kind,
                "model": self.model.to_json(), "metric": self.metric, "source": self.source,
                "points": [dataclasses.asdict(p) for p in self.points]}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)  # never a half-written model file
        return path

    @classmethod
    def from_json(cls, obj: Any, where: str) -> "CostModel":
        """A validated model from parsed JSON; anything wrong is one ConfigError naming `where`."""
        def bad(what: str) -> ConfigError:
            return ConfigError(f"{where}: {what}; fix it or refit it: {REFIT}")

        if not isinstance(obj, dict):
            raise bad(f"holds {_show(obj)}, not a JSON object")
        if obj.get("format") != FORMAT:
            raise bad(f"format is {_show(obj.get('format'))}, not {FORMAT!r}: not a cost model file")
        if obj.get("version") != VERSION:
            raise bad(f"version is {_show(obj.get('version'))}; this code reads version {VERSION}")
        _keys(obj, {"format", "version", "device_kind", "model", "metric", "source", "points"}, "", bad)
        for key in ("device_kind", "metric", "source"):
            if not isinstance(obj[key], str) or (key == "device_kind" and not obj[key]):
                raise bad(f"{key} is {_show(obj[key])}; it must be a{' non-empty' * (key == 'device_kind')} string")
        model = obj["model"]
        if not isinstance(model, dict):
            raise bad(f"model is {_show(model)}; it must be an object of the model's shape")
        names = {f.name for f in dataclasses.fields(ModelSignature)}
        _keys(model, names, "model.", bad, optional=set(MOE_FIELDS))
        for key in (names - {"dtype"}) & model.keys():
            if not _posint(model[key]):
                raise bad(f"model.{key} is {_show(model[key])}; it must be an integer >= 1")
        if not isinstance(model["dtype"], str) or not _is_dtype(model["dtype"]):
            raise bad(f"model.dtype is {_show(model['dtype'])}; it must name a dtype such as \"bfloat16\"")
        pts = obj["points"]
        if not isinstance(pts, list) or not pts:
            raise bad(f"points is {_show(pts)}; it must be a non-empty list of measured rounds")
        points = []
        for i, p in enumerate(pts):
            if not isinstance(p, dict):
                raise bad(f"points[{i}] is {_show(p)}; it must be an object")
            _keys(p, {"method", "batch", "nodes", "prefix", "round_ms"}, f"points[{i}].", bad)
            if p["method"] not in METHODS:
                raise bad(f"points[{i}].method is {_show(p['method'])}; it must be one of {', '.join(METHODS)}")
            for key in ("batch", "prefix"):
                if not _posint(p[key]):
                    raise bad(f"points[{i}].{key} is {_show(p[key])}; it must be an integer >= 1")
            if not _posint(p["nodes"]) and p["nodes"] != 0:
                raise bad(f"points[{i}].nodes is {_show(p['nodes'])}; it must be an integer >= 0")
            ms = p["round_ms"]
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
                raise bad(f"points[{i}].round_ms is {_show(ms)}; it must be a number of ms > 0")
            points.append(Point(p["method"], p["batch"], p["nodes"], p["prefix"], float(ms)))
        try:
            return cls(obj["device_kind"], ModelSignature(**model), tuple(points), obj["metric"], obj["source"])
        except ValueError as e:
            raise bad(str(e)) from None


def _show(value: Any) -> str:
    """A JSON value as JSON spells it, cut to 40 characters."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_budgets(text: str, *, auto: bool = False) -> list[int | str]:
    """'16,64,auto' -> [16, 64, 'auto'] ('auto' only where `auto`), repeats dropped; ValueError,
    one line without the flag's name, for anything else. Every command's budget list goes here."""
    out: list[int | str] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            continue
        if auto and word == "auto":
            v: int | str = word
        elif word.isdigit() and int(word) >= 1:
            v = int(word)
        else:
            raise ValueError(f"{word!r} is not a DDTree budget >= 1{' or auto' * auto} (e.g. 16,64,256)")
        if v not in out:
            out.append(v)
    if not out:
        raise ValueError(f"no budgets in {text!r}; give e.g. 16,64,256")
    return out


def _posint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _is_dtype(name: str) -> bool:
    try:
        return jnp.dtype(name).name == name
    except TypeError:
        return False


def _keys(obj: dict, want: set[str], prefix: str, bad: Callable[[str], ConfigError],
          optional: set[str] = frozenset()) -> None:
    """One error for the first missing (and not optional) or unknown key of obj."""
    missing, unknown = sorted(want - optional - obj.keys()), sorted(obj.keys() - want)
    if missing:
        raise bad(f"{prefix}{missing[0]} is missing")
    if unknown:
        raise bad(f"{prefix}{unknown[0]} is not a field here (fields: {', '.join(sorted(want))})")


def _method_nodes(candidate: Candidate, block_size: int) -> tuple[str, int]:
    if candidate == "ar":
        return "ar", 0
    if candidate == "dflash":
        return "dflash", block_size - 1
    return "ddtree", int(candidate)


def _label(candidate: Candidate) -> str:
    return {"ar": "AR", "dflash": "DFlash"}.get(candidate, f"DDTree-{candidate}")  # type: ignore[arg-type]


def check_candidates(candidates: Sequence[Candidate]) -> tuple[Candidate, ...]:
    """candidates as a tuple; ValueError unless each is "ar", "dflash" or an int >= 1, once each."""
    cands = tuple(candidates)
    for c in cands:
        if c not in ("ar", "dflash") and not _posint(c):
            raise ValueError(f"candidate {c!r}: each must be \"ar\", \"dflash\" or a DDTree budget >= 1")
    if not cands or len(set(cands)) != len(cands):
        raise ValueError(f"candidates {cands}: give at least one, each once")
    return cands


def load_cost_model(path: str | Path, *, device_kind: str | None = None,
                    model: ModelSignature | None = None) -> CostModel:
    """The cost model in `path`; one ConfigError line (naming the file and the fix) if it is
    missing, malformed, or fit on another device kind or model shape than the ones given."""
    where = str(path)
    obj = read_json_file(path, missing=f"give a file written by {REFIT}", error=ConfigError,
                         invalid=f"; refit it: {REFIT}")
    cm = CostModel.from_json(obj, where)
    if device_kind is not None and cm.device_kind != device_kind:
        raise ConfigError(f"{where} was fit on {cm.device_kind}, not this {device_kind}; refit it here: {REFIT}")
    if model is not None and cm.model != model:
        raise ConfigError(f"{where} was fit for another model shape ({cm.model.differences(model)}); refit it "
                          f"for this model: {REFIT}")
    return cm


def default_cost_model(device_kind: str, model: ModelSignature) -> CostModel | None:
    """The shipped model (ddtree_jax/cost_models/) of this device kind and model shape, or None."""
    for path in sorted(SHIPPED_DIR.glob("*.json")):
        cm = load_cost_model(path)
        if cm.device_kind == device_kind and cm.model == model:
            return cm
    return None


def resolve_cost_model(path: str | Path | None, device_kind: str,
                       model: ModelSignature) -> tuple[CostModel | None, str | None]:
    """(model, warning) for `--budget auto`: a file the user named must load and match (else
    ConfigError); without one, the shipped default, or (None, a warning line saying how to fit one)."""
    if path is not None:
        return load_cost_model(path, device_kind=device_kind, model=model), None
    cm = default_cost_model(device_kind, model)
    if cm is None:
        return None, (f"no shipped cost model for {device_kind} at this model's shape; fit one with {REFIT} "
                      f"and pass it")
    return cm, None


# -- the choice --------------------------------------------------------------------------------


def chain_path_logp(draft_logp, xp=jnp):
    """float32[B, D]: the path log-probability of each node of the drafter's top-1 chain (DFlash's
    tree), from its log-probs float[B, D, V]."""
    return xp.cumsum(xp.max(xp.asarray(draft_logp, xp.float32), axis=-1), axis=-1)


def expected_tokens(path_logp, candidates: Sequence[Candidate], *, chain_logp=None, presorted: bool = False,
                    xp=jnp):
    """float32[B, K]: each row's expected tokens a round under each candidate, from the drafter's
    own probabilities: AR 1; DDTree-n 1 + the sum of the path probabilities of the row's best n
    nodes (all of them if it has fewer); DFlash 1 + the sum over the chain (needs chain_logp).

    path_logp: float[B, N], the path log-prob of each node of the round's largest tree (-inf for
    a padding node); presorted: already best first (skips a sort)."""
    cands = check_candidates(candidates)
    logp = xp.asarray(path_logp, xp.float32)
    if logp.ndim != 2:
        raise ValueError(f"path_logp has shape {logp.shape}; it must be [batch, nodes]")
    if not presorted:
        logp = -xp.sort(-logp, axis=-1)
    prob = xp.exp(logp)
    best = xp.concatenate([xp.zeros_like(prob[:, :1]), xp.cumsum(prob, axis=-1)], axis=-1)  # [:, n]: best n
    cols = []
    for c in cands:
        if c == "ar":
            cols.append(xp.ones_like(best[:, 0]))
        elif c == "dflash":
            if chain_logp is None:
                raise ValueError("the dflash candidate needs chain_logp (chain_path_logp of the draft)")
            cols.append(1 + xp.sum(xp.exp(xp.asarray(chain_logp, xp.float32)), axis=-1))
        else:
            cols.append(1 + best[:, min(c, logp.shape[1])])
    return xp.stack(cols, axis=-1)


def choose_budget(path_logp, candidates: Sequence[Candidate], round_ms, active=None, *, chain_logp=None,
                  presorted: bool = False, per_row: bool = False, xp=jnp):
    """Index into `candidates` of the one that maximises the batch's expected tokens per ms this
    round: sum over active rows of `expected_tokens` / round_ms[k]. One choice for the whole
    batch (one verify shape a round); ties go to the first candidate in order (list them
    cheapest first); with no active row, 0. round_ms: float[K] (`CostLines.at`); active: bool[B]
    (rows still generating; default all). jit-able with candidates static; int32 scalar.
    per_row: each row's own best instead, int32[B] (0 for an inactive row): for row-wise node
    masks, or for replay, whose rows are independent rounds."""
    exp = expected_tokens(path_logp, candidates, chain_logp=chain_logp, presorted=presorted, xp=xp)
    if active is not None:
        exp = xp.where(xp.asarray(active)[:, None], exp, 0)
    rate = exp / xp.asarray(round_ms, xp.float32)
    return xp.argmax(rate if per_row else xp.sum(rate, axis=0), axis=-1).astype(xp.int32)


choose_budget_np = functools.partial(choose_budget, xp=np)


def budget_picker(candidates: Sequence[int | str], round_ms) -> Callable[[np.ndarray], np.ndarray]:
    """For offline replay (ddtree_jax.research.replay's budget function): path_logp float[R, N]
    of R independent rounds (-inf at padding) -> int[R], the draft nodes each round verifies (0 for
    "ar"), each round's own best among DDTree budgets and "ar" at fixed costs round_ms[K] (those
    of the batch size being modelled: `CostModel.lines(...).at(prefix, xp=np)`)."""
    cands = check_candidates(candidates)
    if "dflash" in cands:
        raise ValueError("budget_picker picks a number of best nodes; leave out \"dflash\" (another tree)")
    ms = np.asarray(round_ms, np.float32)
    if ms.shape != (len(cands),):
        raise ValueError(f"round_ms has shape {ms.shape}; it needs one cost per candidate ({len(cands)})")
    nodes = np.asarray([0 if c == "ar" else c for c in cands])

    def pick(path_logp) -> np.ndarray:
        return nodes[choose_budget_np(np.asarray(path_logp, np.float32), cands, ms, per_row=True)]

    return pick


def auto_lines(model: CostModel, candidates: Sequence[Candidate], batch: int) -> CostLines | None:
    """`--budget auto`'s lines at `batch`: those of `candidates` the model covers there, cheapest
    first at its smallest prefix (ties in the given order: choose_budget's ties go to the first),
    or None where it covers none of them."""
    cands = [c for c in check_candidates(candidates) if model.covers(c, batch)]
    if not cands:
        return None
    lines = model.lines(cands, batch)
    order = sorted(range(len(cands)), key=lambda i: lines.at_min[i])
    return dataclasses.replace(lines, candidates=tuple(cands[i] for i in order),
                               at_min=tuple(lines.at_min[i] for i in order),
                               slope=tuple(lines.slope[i] for i in order))
