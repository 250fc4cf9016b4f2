"""Training the small demo pair: tokenizer, Qwen3 target, DFlash drafter (`python -m ddtree_jax.train`).

This module holds what the target and drafter trainers share: the optimizer (AdamW with a traced
learning rate), the warmup + cosine schedule fitted to a wall-clock budget, the run directory
(checkpoints written atomically, `--resume`, metrics.json) and the loop itself. The model math
is `ddtree_jax.models`; `train/target.py` and `train/drafter.py` only add losses and data.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ddtree_jax.checkpoint import InterruptsDeferred, on_main_thread
from ddtree_jax.errors import UserError

CKPT = "ckpt"
HF = "hf"
METRICS = "metrics.json"


# ---------------------------------------------------------------------------------------------
# Optimizer and schedule


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Linear warmup to `peak`, then cosine down to `peak * min_ratio` at step `total`."""

    peak: float
    warmup: int
    min_ratio: float

    def __call__(self, step: int, total: int) -> float:
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        span = max(total - self.warmup, 1)
        frac = min(max((step - self.warmup) / span, 0.0), 1.0)
        return self.peak * (self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def make_optimizer(weight_decay: float, grad_clip: float, b1: float = 0.9, b2: float = 0.95):
    """AdamW without its learning rate: the step multiplies the update by a traced `lr`, so a
    schedule refitted to the time budget never recompiles. Norm weights are not decayed."""
    decay_mask = lambda params: jax.tree.map(lambda p: p.ndim >= 2, params)  # noqa: E731
    parts = [optax.scale_by_adam(b1=b1, b2=b2), optax.add_decayed_weights(weight_decay, mask=decay_mask)]
    if grad_clip > 0:
        parts.insert(0, optax.clip_by_global_norm(grad_clip))
    return optax.chain(*parts)


def apply_updates(tx, grads, opt_state, params, lr):
    updates, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - lr * u.astype(p.dtype), params, updates)
    return params, opt_state


def cast_tree(tree: Any, dtype) -> Any:
    return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def count_params(tree: Any) -> int:
    return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


# ---------------------------------------------------------------------------------------------
# The run directory


def write_json_atomic(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


class RunDir:
    """OUT of one training run: OUT/ckpt (last good state), OUT/hf (export), OUT/metrics.json."""

    def __init__(self, out: str | Path, *, resume: bool, force: bool):
        self.out = Path(out)
        self.ckpt = self.out / CKPT
        self.hf = self.out / HF
        if self.out.exists() and not self.out.is_dir():
            raise UserError(f"--out {self.out} is a file; choose a directory")
        if resume:
            if not (self.ckpt / "meta.json").is_file():
                raise UserError(f"--resume: no checkpoint in {self.ckpt}; run without --resume to start training")
        elif (self.ckpt.exists() or self.hf.exists()) and not force:
            raise UserError(f"{self.out} already holds a training run; pass --resume to continue it or --force to start over")
        # OUT itself is created by the first write (metrics, checkpoint), so a run that fails
        # its checks or its data loading leaves nothing behind.
        existing = self.out
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not os.access(existing, os.W_OK):
            raise UserError(f"cannot write to {existing}; choose another --out")

    def read_meta(self) -> dict[str, Any]:
        try:
            return json.loads((self.ckpt / "meta.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UserError(f"{self.ckpt}/meta.json is unreadable ({e}); start over with --force") from None

    def save(self, params: Any, opt_state: Any, meta: dict[str, Any], best: Any = None) -> None:
        """Replace OUT/ckpt atomically; the previous one stays until the new one is complete.
        `best`: optionally a second param tree (the best params seen by the evals)."""
        from ddtree_jax.checkpoint import atomic_directory, save_params

        state = {"params": params, "opt": list(jax.tree.leaves(opt_state))}
        if best is not None:
            state["best"] = best
        with InterruptsDeferred(), atomic_directory(self.ckpt, force=True) as tmp:
            save_params(tmp / "state", state)
            write_json_atomic(tmp / "meta.json", meta)

    def load(self, params_like: Any, opt_like: Any) -> tuple[Any, Any, dict[str, Any], Any]:
        """Restore (params, opt_state, meta, best params or None) shaped like the given trees."""
        from ddtree_jax.checkpoint import load_params

        meta = self.read_meta()
        tree = load_params(self.ckpt / "state")
        p_leaves, p_def = jax.tree.flatten(params_like)
        o_leaves, o_def = jax.tree.flatten(opt_like)
        opt = [np.asarray(x) for x in tree["opt"]]
        shapes = lambda xs: [tuple(np.shape(x)) for x in xs]  # noqa: E731

        def as_params(t):
            got = jax.tree.leaves(t)
            if shapes(got) != shapes(p_leaves):
                raise UserError(f"the checkpoint in {self.ckpt} does not fit this model; start over with --force")
            return jax.tree.unflatten(p_def, [np.asarray(x, np.float32) for x in got])

        params = as_params(tree["params"])
        if shapes(opt) != shapes(o_leaves):
            raise UserError(f"the checkpoint in {self.ckpt} does not fit this optimizer; start over with --force")
        opt_state = jax.tree.unflatten(o_def, [x.astype(np.asarray(o).dtype) for x, o in zip(opt, o_leaves)])
        best = as_params(tree["best"]) if "best" in tree else None
        return params, opt_state, meta, best


# ---------------------------------------------------------------------------------------------
# The loop


@dataclasses.dataclass
class LoopConfig:
    steps: int
    time_budget: float | None
    schedule: Schedule
    log_every: int
    eval_every: int
    ckpt_every: int
    tokens_per_step: int


@dataclasses.dataclass
class LoopResult:
    params: Any
    opt_state: Any
    step: int
    planned_steps: int
    stopped_by: str  # "steps" | "time"
    train_seconds: float  # wall clock of the loop, compilation, evals and checkpoints included
    overhead_seconds: float  # evals and checkpoints
    tokens: int


class SigtermAsInterrupt:
    """SIGTERM unwinds like Ctrl-C for the whole run, so nothing half-written is left behind."""

    def __enter__(self):
        self.old = None
        if hasattr(signal, "SIGTERM") and on_main_thread():
            self.old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum, frame):
        raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.old is not None:
            signal.signal(signal.SIGTERM, self.old)
        return False


class StopAtStepBoundary:
    """SIGINT / SIGTERM during the loop ask it to stop at the next step boundary; a second one
    raises at once (for a step or a compilation that hangs).

    A KeyboardInterrupt raised from the signal handler lands wherever the main thread happens to
    be, and some places swallow it: a finalizer (`__del__`, a weakref or GC callback) reports it as
    "Exception ignored" and the loop carries on, and library code can be left holding a lock. The
    loop then never stops. Raising at the step boundary only leaves neither to chance.
    """

    def __enter__(self):
        self.requested = False
        self.old = {}
        if on_main_thread():
            self.old = {s: signal.signal(s, self._request) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _request(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        return False


def log(msg: str) -> None:
    print(msg, flush=True)


def _first_nonfinite(losses: list) -> tuple[int, float] | None:
    """(index, value) of the first non-finite loss in `losses` (device scalars), or None."""
    values = np.asarray(jax.device_get(jnp.stack(losses)), np.float64)
    bad = np.flatnonzero(~np.isfinite(values))
    return (int(bad[0]), float(values[bad[0]])) if bad.size else None


def _all_finite(tree: Any) -> bool:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return bool(jnp.all(jnp.stack(leaves))) if leaves else True


def _resume_hint(last_ckpt_step: int | None, ckpt_dir: Path) -> str:
    if last_ckpt_step is None:
        return "no checkpoint was written yet"
    return f"the last good checkpoint (step {last_ckpt_step}) is in {ckpt_dir}; --resume continues from it"


def train_loop(
    *,
    cfg: LoopConfig,
    params: Any,
    opt_state: Any,
    start_step: int,
    step_fn: Callable[..., tuple[Any, Any, Any]],
    batch_at: Callable[[int], Any],
    evaluate: Callable[[Any, int], dict[str, float]],
    checkpoint: Callable[[Any, Any, int, int], None],
    metrics: dict[str, list],
    write_metrics: Callable[[], None],
    last_ckpt_step: int | None,
    ckpt_dir: Path,
) -> LoopResult:
    """Run `step_fn(params, opt_state, batch, lr) -> (params, opt_state, loss)` until `cfg.steps`
    or the time budget. With a budget, the schedule's end (`planned`) is refitted at every log
    line from the measured time per step, so the cosine reaches its floor when time runs out.

    A non-finite loss (checked at every log line and before every eval and checkpoint) or
    non-finite weights (before every checkpoint and at the end) stop the run with one UserError
    line naming the step; no checkpoint is written from such a state, so the last one stays good.
    """

    def diverged(what: str):
        write_metrics()
        return UserError(f"training diverged: {what}; lower --lr or check the data; "
                         f"{_resume_hint(last_ckpt_step, ckpt_dir)}")

    def check_losses():
        """The losses of the steps since the last check (`pending`) must be finite."""
        bad = _first_nonfinite(pending) if pending else None
        if bad is not None:
            raise diverged(f"the loss is {bad[1]} at step {step - len(pending) + 1 + bad[0]}")

    def check_weights():
        if not _all_finite(params):
            raise diverged(f"the weights hold NaN or Inf after step {step}")

    planned = cfg.steps
    step = start_step
    t_start = time.time()
    t_mark, step_mark = None, None  # timing starts after the first log line (compilation)
    window = None  # (time, step, overhead) at the previous log line
    overhead = 0.0  # seconds spent in evals and checkpoints
    pending: list = []
    tokens_here = 0
    try:
        with StopAtStepBoundary() as stop:
            while step < planned:
                if stop.requested:
                    raise KeyboardInterrupt
                lr = cfg.schedule(step, planned)
                params, opt_state, loss = step_fn(params, opt_state, batch_at(step), jnp.float32(lr))
                pending.append(loss)
                step += 1
                tokens_here += cfg.tokens_per_step
                if cfg.time_budget is not None and time.time() - t_start >= cfg.time_budget:
                    planned = step
                last = step >= planned
                if step % cfg.log_every == 0 or last or step == start_step + 1:
                    loss_v = float(jnp.mean(jnp.stack(pending)))
                    now = time.time()
                    elapsed = now - t_start
                    if t_mark is None:
                        t_mark, step_mark, rate = now, step, None
                    elif step > step_mark:
                        rate = (now - t_mark) / (step - step_mark)  # seconds per step, evals included
                    else:
                        rate = None
                    if cfg.time_budget is not None and rate:
                        fit = step + int((cfg.time_budget - elapsed) / rate)
                        planned = max(step, min(cfg.steps, fit))
                    tok_s = float("nan")  # pure training throughput over the last window
                    if window is not None and step > window[1]:
                        busy = (now - window[0]) - (overhead - window[2])
                        tok_s = cfg.tokens_per_step * (step - window[1]) / max(busy, 1e-9)
                    window = (now, step, overhead)
                    metrics["train"].append({"step": step, "loss": loss_v, "lr": lr, "tokens_per_s": tok_s,
                                             "elapsed_s": round(elapsed, 2)})
                    log(f"step {step}/{planned} loss {loss_v:.4f} lr {lr:.2e} tok/s {tok_s:,.0f} elapsed {elapsed:.0f}s")
                    check_losses()
                    pending = []
                if cfg.eval_every and step % cfg.eval_every == 0 and not last:
                    check_losses()
                    t0 = time.time()
                    ev = evaluate(params, step)
                    metrics["eval"].append({"step": step, **ev})
                    log(f"eval step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in ev.items()))
                    write_metrics()
                    overhead += time.time() - t0
                if cfg.ckpt_every and step % cfg.ckpt_every == 0 and not last:
                    check_losses()
                    check_weights()
                    t0 = time.time()
                    with InterruptsDeferred():  # an interrupt now is raised once the checkpoint is complete
                        checkpoint(params, opt_state, step, planned)
                        last_ckpt_step = step
                    overhead += time.time() - t0
        check_weights()  # what the caller saves and exports
    except KeyboardInterrupt:
        print(f"interrupted at step {step}: nothing partial was written; {_resume_hint(last_ckpt_step, ckpt_dir)}",
              file=sys.stderr, flush=True)
        raise
    stopped_by = "steps" if step >= cfg.steps else "time"
    jax.block_until_ready(params)
    return LoopResult(params, opt_state, step, planned, stopped_by, time.time() - t_start, overhead, tokens_here)


def describe_budget(args) -> str:
    return f"{args.steps} steps" + (f" or {args.time_budget:.0f} s" if args.time_budget else "")
