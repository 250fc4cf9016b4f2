"""Where a `run_rounds` call's fixed cost comes from: fresh state buffers against reused ones.

    python -m bench.probe_call_fixed --model qwen3-8b --budget 64 --out DIR
    python -m bench.probe_call_fixed --model tiny --rounds 4            # CPU smoke run

A call of R rounds costs R x (steady round) + a fixed part (bench_round's call_fixed_ms: 1.7-4.1
ms at the 8B DDTree-64, session 28). Session 23 saw the round's command buffer updated once a
call, as every call's state is new, donated buffers. Each mode here makes the state of a call
differently and times calls of R and 2R rounds (fixed = 2 t(R) - t(2R)):

- fresh: new caches and a prefill every call (what bench_round and generate do);
- caches: the previous call's caches donated to the prefill (the other state arrays are new);
- state: the previous call's whole state donated to the prefill (every output aliases a buffer:
  engine.prefill_into, what generate does since session 30);
- continue: no prefill, the previous call's state runs on (generate's streaming calls).

For each call it also counts the state's buffers whose addresses differ from the call before.

--dispatch splits the fixed part (session 31: 2.2 ms from a call's start to its first round and
1.2 ms from its last round's end to the return, on the command-buffer log's clock): it times, in
the "state" mode, a call of 0 rounds (the loop's predicate only), with the round count made
inside the timed region (jnp.int32(n), as generate did before session 31) and made before it
(Generator.rounds_limit's cached scalar, as generate and the timed calls now do); and the same
arguments through a jitted identity that donates the state (argument handling and dispatch
alone, no device work), and through identities over the state alone and over the weights
alone. (Session 33's row with the per-layer caches stacked went in session 34: the caches are
stacked now, models.layers.KVCache.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from bench.bench_round import SHAPES, build, setup_request
from ddtree_jax import engine
from ddtree_jax.generator import Generator

MODES = ("fresh", "caches", "state", "continue")


def _pointers(state) -> list[int]:
    return [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(state)]


def _clock(t: float) -> str:
    """Local wall-clock time with microseconds, as XLA's log lines print it (HH:MM:SS.ffffff)."""
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t % 1 * 1e6):06d}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probe_call_fixed", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--method", default="ddtree", choices=("ar", "dflash", "ddtree"))
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--log-calls", action="store_true",
                    help="print each timed call's wall-clock start and end (local time, microseconds), to line "
                         "up with XLA's log (e.g. TF_CPP_VMODULE=command_buffer_thunk=3: one line a round)")
    ap.add_argument("--dispatch", action="store_true",
                    help="also time 0-round calls and an identity over the same arguments (see above)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        ap.error(f"unknown mode(s) {bad}; choose from {MODES}")

    ck = build(args.model, jnp.bfloat16 if args.model != "tiny" else jnp.float32)
    gen = Generator(ck, method=args.method, budget=args.budget)
    rounds = args.rounds
    # bench_round's request (its cache size): random weights commit ~1-2 tokens a round, so the
    # continue mode's ~15 calls stay inside it
    req = setup_request(gen, args.prompt_len, rounds * 40 + 8)
    state0 = req.prefill(*req.pre_args())
    run = engine.run_rounds.lower(gen.tparams, gen.dparams, state0, req.knobs, jnp.int32(rounds),
                                  **req.static).compile(compiler_options=gen.round_options(req.spec))
    del state0

    last = {"state": None, "ptrs": None}

    def fresh_state(mode):
        old = last["state"]
        if mode == "fresh" or old is None:
            return req.prefill(*req.pre_args())
        if mode == "continue":
            return old
        if mode == "caches":
            args_ = list(req.pre_args())
            args_[2], args_[3] = old.cache, old.dcache  # donated to the prefill
            return req.prefill(*args_)
        return req.refill(old)  # engine.prefill_into, as generate runs it since session 30

    def call(mode, n):
        state = jax.block_until_ready(fresh_state(mode))
        ptrs = _pointers(state)
        moved = None if last["ptrs"] is None else sum(a != b for a, b in zip(ptrs, last["ptrs"]))
        w0, t0 = time.time(), time.perf_counter()
        state = run(gen.tparams, gen.dparams, state, req.knobs, gen.rounds_limit(n))
        jax.block_until_ready(state.out)
        ms = 1e3 * (time.perf_counter() - t0)
        last["state"], last["ptrs"] = state, _pointers(state)
        calls.append({"mode": mode, "rounds": n, "start": w0, "ms": ms})
        if args.log_calls:
            print(f"[probe_call_fixed] call {mode} {n} rounds from {_clock(w0)} to {_clock(w0 + ms / 1e3)} "
                  f"({ms:.3f} ms)", flush=True)
        return ms, moved

    calls = []  # every call, warm-up included: mode, rounds, wall-clock start (s), ms
    out = {"model": args.model, "method": args.method, "budget": gen.budget, "rounds": rounds,
           "device": jax.devices()[0].device_kind, "jax": jax.__version__, "cache_size": req.spec.cache_size,
           "modes": {}, "calls": calls}
    for mode in modes:
        last["state"], last["ptrs"] = None, None
        call(mode, rounds), call(mode, 2 * rounds)  # warm-up pair
        per, fixed, moved = [], [], []
        for _ in range(args.repeats):
            (t1, m1), (t2, m2) = call(mode, rounds), call(mode, 2 * rounds)
            per.append(t1 / rounds)
            fixed.append(2 * t1 - t2)
            moved += [m1, m2]
        r = {"round_ms_a_call": per, "call_fixed_ms": fixed, "buffers_moved": moved,
             "leaves": len(last["ptrs"]), "rounds_done": int(last["state"].rounds[0])}
        out["modes"][mode] = r
        print(f"[probe_call_fixed] {mode:8s} a call {statistics.median(per):.3f} ms/round, fixed "
              f"{statistics.median(fixed):.2f} ms (all {['%.2f' % f for f in fixed]}), buffers moved a call "
              f"{moved} of {r['leaves']}", flush=True)
        _save(out, args.out)
    if args.dispatch:
        out["dispatch"] = dispatch_times(gen, req, run, args.repeats * 5)
        print("[probe_call_fixed] dispatch, median ms: " + ", ".join(
            f"{k} {statistics.median(v):.3f}" for k, v in out["dispatch"].items()), flush=True)
        _save(out, args.out)
    return 0


def _save(out: dict, folder: str | None) -> None:
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "call_fixed.json").write_text(json.dumps(out, indent=1))


def dispatch_times(gen: Generator, req, run, repeats: int) -> dict[str, list[float]]:
    """Wall ms (to the state's readiness) of: a 0-round call with its round count made in the timed
    region (zero_made_inside) and before it (zero); the same arguments through a jitted identity
    that donates the state (identity), and through one that takes the state alone
    (identity_state_only); the weights alone, not donated (identity_weights_only); and making the
    round count alone (jnp_int32)."""
    ident = jax.jit(lambda tp, dp, s, k, n: s, donate_argnums=(2,))
    ident_state = jax.jit(lambda s: s, donate_argnums=(0,))
    ident_weights = jax.jit(lambda tp, dp: 0)
    zero = gen.rounds_limit(0)
    state = jax.block_until_ready(req.refill(None))
    times = {"zero_made_inside": [], "zero": [], "identity": [], "identity_state_only": [],
             "identity_weights_only": [], "jnp_int32": []}
    for i in range(repeats + 1):
        for name in times:
            state = jax.block_until_ready(req.refill(state))
            t0 = time.perf_counter()
            if name == "jnp_int32":
                jax.block_until_ready(jnp.int32(i))
            elif name == "identity_state_only":
                state = jax.block_until_ready(ident_state(state))
            elif name == "identity_weights_only":
                jax.block_until_ready(ident_weights(gen.tparams, gen.dparams))
            else:
                fn = ident if name == "identity" else run
                state = fn(gen.tparams, gen.dparams, state, req.knobs,
                           jnp.int32(0) if name == "zero_made_inside" else zero)
                jax.block_until_ready(state)
            if i:  # the first pass warms each up
                times[name].append(1e3 * (time.perf_counter() - t0))
    return times


if __name__ == "__main__":
    raise SystemExit(main())
