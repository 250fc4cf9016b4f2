"""Per-stage timing of the round: each stage jitted alone and run with a sync after it.

`--profile` and the benchmarks read a round's stage breakdown here. The stages are the very
functions `engine.round_step` chains, so a profiled run commits the same tokens as a fused one.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

import jax
import numpy as np

from ddtree_jax import engine
from ddtree_jax.engine import (DecodeSpec, auto_stage, commit_stage, draft_stage, float32_exact, num_nodes,
                               tree_stage, verify_stage)
from ddtree_jax.sampling import choose_tokens
from ddtree_jax.walk import walk

STAGES = ("draft", "tree", "verify", "walk", "commit")


def stage_functions(tcfg, dcfg, spec: DecodeSpec, options: dict | None = None) -> dict[str, Any]:
    """The round's stages as separately jitted functions, for per-stage timing (--profile, bench).

    They are the functions `round_step` chains, so a profiled run commits the same tokens. Each
    stage is jitted once per spec without the fields that only other stages read (`_stage_key`),
    process-wide: specs that differ in those fields share it, and with it its executables per
    input shape. So greedy and sampled runs share every stage but `choose`, and configs whose
    caches have one size share the draft (fewer compiles in the bench suite). options: XLA
    options every stage is compiled with (the round's: `Generator.round_options`).
    """
    opts = (tuple(sorted(options.items())),) if options else ()  # none: the same cache entry as before
    return {name: _stage_fn(name, *_stage_key(name, tcfg, dcfg, spec), *opts)
            for name in ("draft", "tree", "verify", "choose", "walk", "commit")}


def _stage_key(name: str, tcfg, dcfg, spec: DecodeSpec) -> tuple:
    """(tcfg, dcfg, spec, extra) for stage `name`, with the spec fields that only other stages
    read (the tree's budget and policy, the loop's unroll, the sampling, the prefill's chunk) at
    their defaults."""
    default = DecodeSpec()
    tree_free = dataclasses.replace(spec, budget=int(spec.speculative), policy=default.policy, unroll=default.unroll,
                                    sampling=default.sampling, prefill_chunk=default.prefill_chunk, auto=None)
    if name in ("draft", "verify"):
        return tcfg, dcfg, tree_free, None
    if name == "commit":  # extra: the tree slots (root included) the next round writes beyond `length`
        return None, dcfg, tree_free, num_nodes(spec, dcfg) + 1
    if name == "tree":  # extra: the drafter's depth, which auto's chain candidate reads
        return None, None, dataclasses.replace(spec, unroll=default.unroll, sampling=default.sampling,
                                               prefill_chunk=default.prefill_chunk), dcfg.depth if dcfg else 0
    if name == "choose":  # the token choice reads the sampling and (extra) the deterministic mode alone
        return None, None, DecodeSpec(sampling=spec.sampling), spec.tuning.kernels.deterministic
    if name == "walk":  # extra: the tree depth, all the walk reads
        return None, None, default, dcfg.depth if spec.speculative else 0
    raise ValueError(name)


@functools.lru_cache(maxsize=256)
def _stage_fn(name: str, tcfg, dcfg, spec: DecodeSpec, extra, options: tuple = ()):
    # the kernels are chosen for an executable compiled with these options (engine.round_kernels
    # adds the round's on top)
    kernels = spec.tuning.kernels.compiled_with(dict(options))
    spec = dataclasses.replace(spec, tuning=dataclasses.replace(spec.tuning, kernels=kernels))

    def jit(fn, **kw):
        return jax.jit(fn, compiler_options=dict(options) or None, **kw)
    if name == "draft":
        return jit(functools.partial(float32_exact(draft_stage), tcfg=tcfg, dcfg=dcfg, spec=spec))
    if name == "tree":
        if spec.auto is not None:
            return jit(functools.partial(auto_stage, spec=spec, depth=extra))
        return jit(functools.partial(tree_stage, spec=spec))
    if name == "verify":
        return jit(functools.partial(float32_exact(verify_stage), tcfg=tcfg, dcfg=dcfg, spec=spec))
    if name == "choose":
        def _choose(logits, key, knobs, positions):
            return choose_tokens(key, logits, spec.sampling, knobs.temperature, knobs.top_p, positions, bool(extra))

        return jit(_choose)
    if name == "walk":
        def _walk(tree_, target_tokens):
            return walk(tree_, target_tokens, extra)

        return jit(_walk)
    if name == "commit":
        @float32_exact
        def _commit(dparams, state, new_kv, tapped, result, knobs):
            return commit_stage(dparams, state, new_kv, tapped, result, knobs, dcfg=dcfg, spec=spec, slots=extra)

        return jit(_commit, donate_argnums=(1,))
    raise ValueError(name)


def profiled_rounds(tparams, dparams, state: engine.State, knobs: engine.Knobs, *, tcfg, dcfg, spec: DecodeSpec,
                    options: dict | None = None, first_compiles: bool = True,
                    on_round: Callable[[engine.State], bool] | None = None):
    """Rounds until every row is done, each stage a separate call followed by a sync.

    Returns (state, {stage: ms per round}). first_compiles: the first round compiles the stages
    and is left out of the figures. on_round(state) is called after every round (streaming); True
    ends the rounds.
    """
    fns = stage_functions(tcfg, dcfg, spec, options)
    totals = dict.fromkeys(STAGES, 0.0)
    rounds = 0

    def timed(name, fn, *args):
        t = time.perf_counter()
        out = jax.block_until_ready(fn(*args))
        if rounds > 0 or not first_compiles:
            totals[name] += time.perf_counter() - t
        return out

    while not np.asarray(state.done).all():
        if spec.speculative:
            logp = timed("draft", fns["draft"], tparams, dparams, state)
            tree = timed("tree", fns["tree"], logp, state, engine.draft_vocab(dparams))
            if spec.auto is not None:  # (the chosen candidate, every candidate's tree)
                tree = tree[1][int(tree[0])]
        else:
            tree = engine.root_tree(state)
        logits, tapped, new_kv = timed("verify", fns["verify"], tparams, state, tree)
        target_tokens = timed("verify", fns["choose"], logits, state.key, knobs,
                              engine.draw_positions(state, tree))
        result = timed("walk", fns["walk"], tree, target_tokens)
        state = timed("commit", fns["commit"], dparams, state, new_kv, tapped, result, knobs)
        rounds += 1
        if on_round is not None and on_round(state):
            break
    timed_rounds = rounds - 1 if first_compiles else rounds
    return state, {k: 1e3 * v / max(timed_rounds, 1) for k, v in totals.items()}
