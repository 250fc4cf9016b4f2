"""Round latency on a large random-weight model: AR step, DFlash and DDTree rounds, stage breakdown.

    python -m bench round --model qwen3-8b --prompt-len 512 --budgets 16,64,256,1024 --out DIR
    python -m bench round --model tiny --rounds 4          # CPU smoke run
    python -m bench round --batch 1,4,16 --prompt-len 512,4096 --out DIR   # a grid for bench fit-cost

Random weights accept ~nothing, but a round's cost does not depend on what is accepted (static
shapes): every round verifies the full tree, compacts D+1 slots and feeds the drafter D+1 taps.
The fused time comes from `engine.run_rounds` (the on-device while_loop, as generate runs it)
over --rounds rounds; the stage breakdown either from `ddtree_jax.profile.profiled_rounds` (each
stage a separate call followed by a sync, as `--profile` times it) or, with --stage-loop, from
each stage alone in a device loop (no host dispatch per stage: what the large shapes need).

A mixture-of-experts shape of a dense family (qwen3-30b-a3b; tiny-moe on the CPU; not a hybrid
one: the count runs models/target.py) also reports per row the distinct experts a layer the
round's verify reads (one more pass after the timed calls, on the last call's final state) and
the round's bytes floor from them (moe_round_stats): which part of a round is the experts'
bytes, and how far the round is from reading only those.

A hybrid shape (qwen3.5-9b, qwen3.5-27b, qwen3.5-35b-a3b; tiny-hybrid on the CPU: Gated DeltaNet and gated
attention layers, models/hybrid.py) is built from its HF config by HybridConfig.from_hf, its random
weights drawn from the checkpoint name table (init_from_entries); its rows also report the cache's
bytes, the recurrent states' share of them, and the bytes a verify pass leaves for the commit.

With --tp N the weights are placed over N devices as generate's --tp places them, a tensor at a
time (place_for_tp), and each row also reports a device's share of the weights the round reads,
the round's all-reduces (two a layer, measured in a device loop) and tp_floor_ms, their sum:
    python -m bench round --model qwen3-32b --methods ar,ddtree --budgets 64,256 --tp 2
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jax.sharding import NamedSharding, PartitionSpec as P

from ddtree_jax import engine, profile, sharding
from ddtree_jax.checkpoint import names
from ddtree_jax.cost import ModelSignature, parse_budgets
from ddtree_jax.generator import Generator, tree_nbytes as nbytes
from ddtree_jax.models import moe as moe_block, target as tmodel
from ddtree_jax.models.config import (DrafterConfig, MoeConfig, RopeConfig, TargetConfig, check_pair,
                                      default_target_layer_ids)
from ddtree_jax.models.family import Hybrid, family_of
from ddtree_jax.models.hybrid import HybridConfig
from ddtree_jax.models.init import init_drafter, init_from_entries, init_target
from ddtree_jax.models.layers import fuse_layer_weights
from ddtree_jax.tuning import GDN_TREE_FORMS, MOE_EXPERT_IMPLS, tuning_for

# H100 SXM's HBM3 bandwidth (datasheet): the MoE rows' bytes floor is for the card they are timed on
HBM_BYTES_PER_S = 3.35e12

SHAPES = {
    # Qwen3-8B and its 5-layer DFlash drafter (block 16, taps [1, 9, 17, 25, 33])
    "qwen3-8b": dict(
        target=dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
                    num_kv_heads=8, head_dim=128, max_position=40960, tie_embeddings=False),
        drafter=dict(num_layers=5, block_size=16, target_layer_ids=(1, 9, 17, 25, 33)),
        theta=1000000.0,
    ),
    # Qwen3-30B-A3B: every layer sparse (intermediate_size sizes the drafter alone). Its drafter is
    # assumed (the 8B entry's at hidden 2048, taps spread over 1..L-3): z-lab's config was not read.
    "qwen3-30b-a3b": dict(
        target=dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=48, num_heads=32,
                    num_kv_heads=4, head_dim=128, max_position=40960, tie_embeddings=False),
        moe=dict(num_experts=128, top_k=8, expert_intermediate=768, norm_topk_prob=True),
        drafter=dict(num_layers=5, block_size=16, target_layer_ids=(1, 12, 23, 34, 45)),
        theta=1000000.0,
        # JAX's default pool is 75 % of a GPU: 61 GB of weights need more of an 80 GB card
        mem_fraction=0.95,
    ),
    # Qwen3-32B (64 layers, 64 q / 8 kv heads of 128; 65.5 GB in bf16: one 80 GB card, or --tp 2 / 4).
    # Its drafter is assumed (the 8B entry's at the 32B's width, default taps): z-lab's config was not read.
    "qwen3-32b": dict(
        target=dict(vocab_size=151936, hidden_size=5120, intermediate_size=25600, num_layers=64, num_heads=64,
                    num_kv_heads=8, head_dim=128, max_position=40960, tie_embeddings=False),
        drafter=dict(num_layers=5, block_size=16, target_layer_ids=(1, 16, 31, 46, 61)),
        theta=1000000.0,
        mem_fraction=0.95,
    ),
    # the shipped pair's shapes (ddtree_jax/default_model; random weights: round times, no acceptance)
    "shipped": dict(
        target=dict(vocab_size=8192, hidden_size=256, intermediate_size=512, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=64, max_position=2048, tie_embeddings=True),
        drafter=dict(num_layers=2, block_size=16, target_layer_ids=(1, 2)),
        theta=10000.0,
    ),
    "tiny": dict(
        target=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4,
                    num_kv_heads=2, head_dim=16, max_position=4096, tie_embeddings=False),
        drafter=dict(num_layers=1, block_size=8, target_layer_ids=(1, 2)),
        theta=10000.0,
    ),
    # Hybrid targets: `hf` is the HF config (a dict, or (transformers class, architecture): that
    # class's defaults, which are the published model's shape; rope theta and context are
    # transformers' defaults, which cost the same); the drafter's taps default to
    # default_target_layer_ids, its heads / head_dim / intermediate size to the target's.
    # Qwen3.5-9B: 32 layers (every 4th full attention), hidden 4096, 16 q / 4 kv heads of 256,
    # rotary 0.25, GDN 16 key / 32 value heads of 128, vocab 248320 (8.95 B params). Its drafter is
    # assumed (z-lab's config was not read): 5 layers, block 16, taps 1, 8, .., 29 and 32 heads of
    # 128 as a third-party card of a tuned copy describes it; 8 kv heads and intermediate 12288 as
    # Qwen3-8B's drafter.
    "qwen3.5-9b": dict(
        hf=("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
        drafter=dict(num_layers=5, block_size=16, num_heads=32, num_kv_heads=8, head_dim=128),
    ),
    # Qwen3.5-27B: the 9B's class at the 27B text config as published (hidden 5120, 64 layers, 24 q /
    # 4 kv heads of 256, GDN 16 key / 48 value heads of 128, intermediate 17408: 26.9 B params, 54 GB
    # in bf16). Its drafter is assumed as the 9B entry's.
    "qwen3.5-27b": dict(
        hf=("Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
            dict(hidden_size=5120, num_hidden_layers=64, num_attention_heads=24, num_key_value_heads=4, head_dim=256,
                 intermediate_size=17408, linear_num_value_heads=48)),
        drafter=dict(num_layers=5, block_size=16, num_heads=32, num_kv_heads=8, head_dim=128),
        mem_fraction=0.95,   # 57 GB of weights with the drafter's: more of an 80 GB card than JAX's default 75 %
    ),
    # Qwen3.5-35B-A3B: 40 layers, hidden 2048, 16 q / 2 kv heads of 256, every MLP 256 experts of
    # 512 (8 a token) and a shared expert of 512 (34.7 B params, 3.5 B a token). Its drafter is
    # assumed as the qwen3-30b-a3b entry's (32 / 4 heads of 128, intermediate 6144).
    "qwen3.5-35b-a3b": dict(
        hf=("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
        drafter=dict(num_layers=5, block_size=16, num_heads=32, num_kv_heads=4, head_dim=128,
                     intermediate_size=6144),
        # 69 GB of weights in bf16: more of an 80 GB card than JAX's default 75 %
        mem_fraction=0.95,
    ),
    # a few MB of dense hybrid target for the CPU tests: layers GDN, GDN, GDN, attention
    "tiny-hybrid": dict(
        hf=dict(architectures=["Qwen3_5ForCausalLM"], vocab_size=512, hidden_size=64, intermediate_size=128,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_conv_kernel_dim=4, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
        drafter=dict(num_layers=1, block_size=8, target_layer_ids=(1, 2)),
    ),
    # a few MB of MoE target for the CPU tests
    "tiny-moe": dict(
        target=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, max_position=4096, tie_embeddings=False),
        moe=dict(num_experts=8, top_k=2, expert_intermediate=32, norm_topk_prob=True),
        drafter=dict(num_layers=1, block_size=8, target_layer_ids=(0, 1)),
        theta=10000.0,
    ),
}


def xla_options(items) -> dict | None:
    """KEY=VALUE strings -> XLA compiler options with typed values: XLA rejects the string 'true'
    for a bool option ("'true' is not a valid bool value"), so true/false become bools and
    integers ints; anything else (an empty value too) stays a string."""
    if items is None:
        return None
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        low = value.strip().lower()
        if low in ("true", "false"):
            out[key] = low == "true"
        elif low.lstrip("-").isdigit():
            out[key] = int(low)
        else:
            out[key] = value
    return out


def hf_config(model: str) -> dict:
    """A hybrid shape's HF config (config.json's dict): its own, or its transformers class's (with
    the entry's overrides, the class deriving the rest, such as the layer types, from them)."""
    hf = SHAPES[model]["hf"]
    if isinstance(hf, dict):
        return dict(hf)
    cls_name, arch, *overrides = hf
    import transformers

    cls = getattr(transformers, cls_name, None)
    if cls is None:
        raise SystemExit(f"bench round --model {model} reads transformers.{cls_name}'s defaults; transformers "
                         f"{transformers.__version__} has none (install a release with Qwen3.5)")
    return {**cls(**(overrides[0] if overrides else {})).to_dict(), "architectures": [arch]}


def hybrid_configs(model: str) -> tuple[HybridConfig, DrafterConfig]:
    """A hybrid shape's target config (HybridConfig.from_hf of its HF config) and its drafter's."""
    tc = HybridConfig.from_hf(hf_config(model), where=f"bench round --model {model}")
    d = SHAPES[model]["drafter"]
    n = d["num_layers"]
    dc = DrafterConfig(hidden_size=tc.hidden_size, intermediate_size=d.get("intermediate_size", tc.intermediate_size),
                       num_layers=n, num_heads=d.get("num_heads", tc.num_heads),
                       num_kv_heads=d.get("num_kv_heads", tc.num_kv_heads), head_dim=d.get("head_dim", tc.head_dim),
                       rms_eps=1e-6, block_size=d["block_size"],
                       target_layer_ids=tuple(d.get("target_layer_ids") or default_target_layer_ids(tc.num_layers, n)),
                       mask_token_id=tc.vocab_size - 1, num_target_layers=tc.num_layers, vocab_size=tc.vocab_size,
                       sliding_windows=(None,) * n, rope=tc.rope)
    check_pair(tc, dc)
    return tc, dc


def build_hybrid(model: str, dtype, fuse: bool = True) -> types.SimpleNamespace:
    """A hybrid shape's configs and random weights on the device: the target in the inference
    layout (each layer fused as drawn: a Generator's fuse_params then copies nothing), or in the
    checkpoint's (fuse False: what --tp places)."""
    tc, dc = hybrid_configs(model)
    # unsafe_rbg: as build's (threefry is slow for GBs of weights)
    tp = init_from_entries(names.entries_for(tc), jax.random.key(0, impl="unsafe_rbg"), dtype, jit=True,
                           fuse=functools.partial(family_of(tc).fuse_params, stack=False) if fuse else None)
    dp = init_drafter(dc, jax.random.key(1, impl="unsafe_rbg"), dtype, jit=True)
    jax.block_until_ready((tp, dp))
    return types.SimpleNamespace(target_cfg=tc, target_params=tp, drafter_cfg=dc, drafter_params=dp,
                                 tokenizer_dir=None, meta={})


def set_mem_fraction(model: str) -> None:
    """A shape's device memory share for JAX (read when the backend starts: call before the first array)."""
    if "mem_fraction" in SHAPES[model]:
        os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(SHAPES[model]["mem_fraction"]))


def build(model: str, dtype, tp: int = 1) -> types.SimpleNamespace:
    """A shape's configs and random weights on the device; tp > 1: placed as --tp places them."""
    s = SHAPES[model]
    if "hf" in s:
        ck = build_hybrid(model, dtype, fuse=tp == 1)
        return ck if tp == 1 else place_for_tp(ck, tp)
    t = s["target"]
    rope = RopeConfig(theta=s["theta"])
    kind = (dict(family="qwen3_moe", architecture="Qwen3MoeForCausalLM",
                 moe=MoeConfig(**s["moe"], sparse_layers=(True,) * t["num_layers"])) if "moe" in s
            else dict(family="qwen3"))
    tc = TargetConfig(rms_eps=1e-6, qk_norm=True, qkv_bias=False, rope=rope, **kind, **t)
    d = s["drafter"]
    dc = DrafterConfig(hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
                       num_layers=d["num_layers"], num_heads=t["num_heads"], num_kv_heads=t["num_kv_heads"],
                       head_dim=t["head_dim"], rms_eps=1e-6, block_size=d["block_size"],
                       target_layer_ids=d["target_layer_ids"], mask_token_id=t["vocab_size"] - 1,
                       num_target_layers=t["num_layers"], vocab_size=t["vocab_size"],
                       sliding_windows=(None,) * d["num_layers"], rope=rope)
    # unsafe_rbg keys: threefry took 102 s for the 8B shape's 18 GB of weights on the H200. Typed
    # keys carry the generator, so the process-wide default (sampling) stays threefry.
    # fused_experts: the experts' gate/up drawn in the inference layout, which fusing then keeps as is
    tp_params = init_target(tc, jax.random.key(0, impl="unsafe_rbg"), dtype, jit=True, fused_experts=True)
    if tc.moe is not None and tp == 1:
        # q/k/v fused here, a layer at a time: each Generator's fuse_params then copies nothing, so
        # the 30B-A3B shape's 61 GB are on the device once, whatever Generators share them
        for i, layer in enumerate(tp_params["layers"]):
            tp_params["layers"][i] = fuse_layer_weights(layer, {"qkv": ("q", "k", "v")})
        del layer
    dp = init_drafter(dc, jax.random.key(1, impl="unsafe_rbg"), dtype, jit=True)
    jax.block_until_ready((tp_params, dp))
    ck = types.SimpleNamespace(target_cfg=tc, target_params=tp_params, drafter_cfg=dc, drafter_params=dp,
                               tokenizer_dir=None, meta={})
    return ck if tp == 1 else place_for_tp(ck, tp)


def place_for_tp(ck: types.SimpleNamespace, tp: int) -> types.SimpleNamespace:
    """ck's weights (the checkpoint's layout) placed as --tp places them (sharding.Streamer), in
    place, each single-device original dropped as its shards land: the first device never holds
    the model twice. A Generator(tp=tp) then keeps them as they are."""
    s = sharding.Streamer(sharding.make_mesh(tp))
    for params in (ck.target_params, ck.drafter_params):
        for k in [k for k in params if k != "layers"]:
            params[k] = s.put(k, params[k])
        layers = params["layers"]
        for i in range(len(layers)):
            layers[i] = s.layer(layers[i])
    jax.block_until_ready((ck.target_params, ck.drafter_params))
    return ck


@functools.lru_cache(maxsize=None)   # a row's rows recur across rows and methods: measured once
def allreduce_ms(tp: int, rows: int, hidden: int, dtype, reps: int = 100) -> float:
    """One all-reduce (a sum over `tp` devices) of a [rows, hidden] activation, as GSPMD inserts
    after o, down and the experts: ms a call, from `reps` dependent calls in a device loop."""
    mesh = sharding.make_mesh(tp)
    ax = sharding.AXIS

    def body(x):
        return jax.lax.fori_loop(0, reps, lambda _, y: jax.lax.psum(y, ax) * jnp.asarray(1 / tp, y.dtype), x)

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(ax), out_specs=P(ax), check_vma=False))
    x = jax.device_put(jnp.ones((tp * rows, hidden), dtype), NamedSharding(mesh, P(ax)))
    jax.block_until_ready(f(x))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(1e3 * (time.perf_counter() - t0) / reps)
    return statistics.median(times)


def tp_round_floor(gen: Generator, ck, r: dict, batch: int, dtype) -> dict:
    """A --tp row's fields: a device's share of the weights the round reads (the drafter's and its
    replicated head too unless AR) at HBM_BYTES_PER_S, the round's all-reduces measured (two a
    layer: the target's over the verify's rows, the drafter's over its block), and the round's
    floor, their sum."""
    tcfg, dcfg, hidden, n = gen.tcfg, gen.dcfg, gen.tcfg.hidden_size, gen.tp
    weights = sharding.weight_bytes_per_device(ck.target_params, n)
    reduce_ms = 2 * tcfg.num_layers * allreduce_ms(n, batch * (r["nodes"] + 1), hidden, dtype)
    if r["method"] != "ar":
        itemsize = jnp.dtype(dtype).itemsize
        weights += (sharding.weight_bytes_per_device(ck.drafter_params, n)
                    + sharding.draft_head_bytes(tcfg, True, itemsize, n))
        reduce_ms += 2 * dcfg.num_layers * allreduce_ms(n, batch * dcfg.block_size, hidden, dtype)
    floor = 1e3 * weights / HBM_BYTES_PER_S + reduce_ms
    return {"tp": n, "tp_weight_bytes_per_device": weights, "allreduce_ms_per_round": reduce_ms,
            "tp_floor_ms": floor, "tp_floor_ratio": r["round_ms_steady"] / floor}


def device_memory() -> dict | None:
    """The first device's bytes in use, its peak so far and its allocator's limit (None where the
    backend reports none: the CPU)."""
    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_in_use" not in stats:
        return None
    return {"in_use": stats["bytes_in_use"], "peak": stats.get("peak_bytes_in_use"), "limit": stats.get("bytes_limit")}


def setup_request(gen: Generator, prompt_len: int, max_new_tokens: int, batch: int = 1, *,
                  temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0) -> types.SimpleNamespace:
    """`batch` random prompts (one length) for gen: its spec (a cache for max_new_tokens), static
    args, knobs, `zeros()` (a new state of zeros) and `refill(old, max_new)`: the prefill as
    generate runs it (`engine.prefill_into`), into a finished state's buffers (or new zeros), each
    row done after max_new tokens (default: max_new_tokens). Greedy unless a temperature is given."""
    spec = gen.spec_for(prompt_len, max_new_tokens, engine.SamplingConfig.make(temperature, top_k), batch=batch)
    static = dict(tcfg=gen.tcfg, dcfg=gen.dcfg, spec=spec)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(0, gen.tcfg.vocab_size - 2, size=(batch, prompt_len)), jnp.int32)
    lens = jnp.full((batch,), prompt_len, jnp.int32)
    knobs = engine.make_knobs(temperature, top_p)

    def args(max_new: int) -> tuple:
        return prompt, lens, jnp.full((batch,), max_new, jnp.int32), knobs, jax.random.PRNGKey(0)

    # the prefill's static args as generate passes them: rows that differ in the tree alone (and a
    # Generator of the same shapes) share its executable
    pre_static = dict(static, spec=engine.prefill_spec(spec))
    shapes = engine.state_shapes(gen.tparams, gen.dparams, *args(max_new_tokens), **pre_static)
    if gen.mesh is not None:   # placed as the Generator places a state under --tp
        shapes = sharding.state_shardings(shapes, gen.mesh)
    into = engine.prefill_into.lower(shapes, gen.tparams, gen.dparams, *args(max_new_tokens), **pre_static).compile(
        compiler_options=gen.compiler_options)

    def zeros():
        """A new state of zeros, in new buffers (what a first request prefills into)."""
        return sharding.zeros_like_shapes(shapes)

    def refill(old=None, max_new: int = max_new_tokens):
        """A state as Generator.generate_ids makes one: prefilled into `old` (a finished call's state,
        donated: every buffer reused) or, without one, into new zeros."""
        return into(zeros() if old is None else old, gen.tparams, gen.dparams, *args(max_new))

    return types.SimpleNamespace(spec=spec, static=static, knobs=knobs, zeros=zeros, refill=refill)


def fused_times(gen: Generator, run, fresh_state, knobs, rounds: int, repeats: int,
                keep: list | None = None) -> tuple[list, list]:
    """Per repeat: ms per round of one compiled `run_rounds` call of `rounds` rounds (includes the
    call's fixed cost: launch, and where the state's buffers are new, the update of the rounds'
    command buffers), and the steady-state marginal ms of a round (a call of 2 x rounds minus a call
    of rounds: what a long generation pays per round). Each call starts from a new prefill,
    fresh_state(previous call's final state or None); one warm-up pair first. keep: a list that
    gets the last call's final state."""
    last = [None]

    def call(n_rounds: int) -> tuple[float, int]:
        prev, last[0] = last[0], None
        state = jax.block_until_ready(fresh_state(prev))
        del prev
        t0 = time.perf_counter()
        state = run(gen.tparams, gen.dparams, state, knobs, gen.rounds_limit(n_rounds))  # as generate
        jax.block_until_ready(state.out)
        ms = 1e3 * (time.perf_counter() - t0)
        last[0] = state
        return ms, int(state.rounds[0])

    call(rounds), call(2 * rounds)
    fused, steady = [], []
    for _ in range(repeats):
        (t1, n1), (t2, n2) = call(rounds), call(2 * rounds)
        fused.append(t1 / max(n1, 1))
        steady.append((t2 - t1) / max(n2 - n1, 1))
    if keep is not None:
        keep.append(last[0])
    return fused, steady


def measure(gen: Generator, prompt_len: int, rounds: int, repeats: int, stage_repeats: int, batch: int = 1,
            verify_loop: bool = False, stage_loop: bool = False, fresh_buffers: bool = False) -> dict:
    """One row: the fused rounds (a call and the steady state), the prefill, the stage breakdown.
    fresh_buffers: every timed call's state in new buffers (new zeros and a prefill); by default
    each call prefills into the last call's state, as generate does (engine.prefill_into)."""
    # room for 2 x rounds rounds even if random weights accept a few tokens a round
    req = setup_request(gen, prompt_len, rounds * 40 + 8, batch)
    spec, static, knobs = req.spec, req.static, req.knobs
    # the prefill as generate runs it (engine.prefill_into): the first into new zeros (it includes
    # the executable's first-run set-up), the second into the first's state (warm, buffers kept)
    prefill_ms, state = [], None
    for _ in range(2):
        old = jax.block_until_ready(req.zeros() if state is None else state)
        t0 = time.perf_counter()
        state = jax.block_until_ready(req.refill(old))
        prefill_ms.append(1e3 * (time.perf_counter() - t0))
    run = engine.run_rounds.lower(gen.tparams, gen.dparams, state, knobs, jnp.int32(rounds), **static).compile(
        compiler_options=gen.round_options(spec))
    hybrid = hybrid_bytes(gen, spec, state) if family_of(gen.tcfg) is Hybrid else {}

    fresh = (lambda prev: req.refill(None)) if fresh_buffers else req.refill
    # the last call's final state: the MoE stats' input (a dense family's: they run models/target.py)
    kept = [] if gen.tcfg.moe is not None and family_of(gen.tcfg) is not Hybrid else None
    fused, steady = fused_times(gen, run, fresh, knobs, rounds, repeats, keep=kept)
    call_fixed = [(f - s) * rounds for f, s in zip(fused, steady)]
    loops = {}
    if stage_loop or verify_loop:
        loops = stage_loop_times(gen, spec, req.refill(None), knobs, rounds, repeats,
                                 only=None if stage_loop else ("verify",))
    if stage_loop:
        stages = {k: statistics.median(v) for k, v in loops.items()}
    else:
        stages = stage_times(gen, spec, req.refill, knobs, stage_repeats)
    moe = moe_round_stats(gen, spec, kept.pop(), statistics.median(steady)) if kept else {}
    return {
        "verify_ms_steady": statistics.median(loops["verify"]) if loops else None,
        "verify_ms_steady_all": loops.get("verify", []),
        "round_ms_median": statistics.median(fused),
        "round_ms_all": fused,
        "round_ms_steady": statistics.median(steady),
        "round_ms_steady_all": steady,
        # what a call costs beyond its rounds (a call - rounds x steady: 1-24 ms at the 8B
        # DDTree-256, the largest part of the per-call figure's spread between machine starts)
        "call_fixed_ms": statistics.median(call_fixed),
        "call_fixed_ms_all": call_fixed,
        "prefill_ms": prefill_ms[1],
        "prefill_first_ms": prefill_ms[0],
        "stage_ms": stages,
        "stage_timing": "device loop" if stage_loop else "synced calls" if stages else None,
        "nodes": engine.num_nodes(spec, gen.dcfg),
        "cache_size": spec.cache_size,
        **moe,
        **hybrid,
    }


def hybrid_bytes(gen: Generator, spec, state) -> dict:
    """A hybrid target's row fields: its cache's bytes (Hybrid.cache_bytes: the attention layers'
    KV at spec.cache_size positions and the GDN layers' conv and recurrent states), the states'
    share alone, and the bytes one verify pass leaves for the commit (the attention layers' new
    K/V and the GDN layers' gdn.TreeStates; auto: its largest candidate's), from the traced
    shapes (nothing runs)."""
    tcfg, batch = gen.tcfg, state.length.shape[0]
    itemsize = jnp.dtype(gen.tparams["embed"].dtype).itemsize
    static = dict(tcfg=tcfg, dcfg=gen.dcfg, spec=spec)

    def verify_outs(tp, dp, st):  # one per tree the round may verify (auto's candidates)
        return [engine.verify_stage(tp, st, tree, **static)[2] for tree in _next_trees(tp, dp, st, **static)[1]]

    new = jax.eval_shape(verify_outs, gen.tparams, gen.dparams, state)
    return {
        "cache_bytes": Hybrid.cache_bytes(tcfg, batch, spec.cache_size, itemsize),
        "recurrent_state_bytes": Hybrid.cache_bytes(tcfg, batch, 0, itemsize),
        "verify_state_bytes": max(map(nbytes, new)),
    }


def _next_trees(tparams, dparams, state, *, tcfg, dcfg, spec):
    """(the index of the tree it verifies, [trees]) of the round after `state`, as round_step
    builds them: the root alone (AR), the policy's tree, or auto's candidates and its choice."""
    if not spec.speculative:
        return jnp.int32(0), [engine.root_tree(state)]
    logp = engine.draft_stage(tparams, dparams, state, tcfg=tcfg, dcfg=dcfg, spec=spec)
    vocab = engine.draft_vocab(dparams)
    if spec.auto is not None:
        return engine.auto_stage(logp, state, vocab, spec=spec, depth=dcfg.depth)
    return jnp.int32(0), [engine.tree_stage(logp, state, vocab, spec=spec)]


@engine.float32_exact  # the precision the round's verify traces with: the same routing
def _round_counts(tparams, dparams, state, *, tcfg, dcfg, spec, pick: int = 0):
    """(int32 [L, E]: the assignments each expert gets in the verify pass of the round after
    `state`, the pass's tokens): engine.verify_stage's forward over the tree's rows alone (padding
    rows would be routed too). pick: which of _next_trees' trees (auto's choice)."""
    tree = _next_trees(tparams, dparams, state, tcfg=tcfg, dcfg=dcfg, spec=spec)[1][pick]
    pos = state.length[:, None] + tree.depths
    *_, counts = tmodel.forward(tparams, tcfg, tree.tokens, pos, state.cache, state.length, tree.ancestor_mask,
                                kernels=engine.round_kernels(spec, dcfg), moe_stats=True)
    return counts, jnp.int32(tree.tokens.size)


def moe_round_stats(gen: Generator, spec, state, round_ms: float) -> dict:
    """A mixture-of-experts target's row fields: the distinct experts of each sparse layer that the
    round after `state` reads (its verify's tokens' top-k: forward's moe_stats; over every batch
    row, since they share the read), and the round's bytes floor at HBM_BYTES_PER_S: the dense
    target weights (attention, norms, routers, the LM head; the embedding's few rows left out),
    the drafter's weights and the head again for its logits (speculative rows: a separate pass
    that the L2 cannot bridge), and the distinct experts' weights. floor_ratio: round_ms (the
    steady round) over the floor. KV-cache reads are left out (~0.1 GB at the 30B-A3B shape's P=512)."""
    tcfg, dcfg = gen.tcfg, gen.dcfg
    static = dict(tcfg=tcfg, dcfg=dcfg, spec=spec)
    opts = gen.round_options(spec)
    args = (gen.tparams, gen.dparams, state)

    def compiled(fn, **extra):
        return jax.jit(functools.partial(fn, **extra), static_argnames=tuple(static)).lower(*args, **static).compile(
            compiler_options=opts)

    pick = int(compiled(_next_trees)(*args)[0]) if spec.auto is not None else 0  # auto: its choice first
    counts, tokens = compiled(_round_counts, pick=pick)(*args)
    sparse = [i for i in range(tcfg.num_layers) if tcfg.is_moe_layer(i)]
    distinct = np.asarray(moe_block.distinct_experts(counts))[sparse]

    tp = gen.tparams
    head = tp["lm_head"] if "lm_head" in tp else tp["embed"]
    dense = (nbytes(head) + nbytes({k: v for k, v in tp.items() if k not in ("layers", "embed", "lm_head")})
             + sum(nbytes(v) for p in tp["layers"] for k, v in p.items() if not k.startswith("experts_")))
    drafter = 0
    if spec.speculative:  # a drafter with its own (cut or int8) head reads that one
        drafter = nbytes(gen.dparams) + (0 if "lm_head" in gen.dparams else nbytes(head))
    itemsize = tp["layers"][sparse[0]]["experts_down"].dtype.itemsize
    expert = 3 * tcfg.hidden_size * tcfg.moe.expert_intermediate * itemsize  # gate, up and down
    experts = int(distinct.sum()) * expert
    floor_ms = 1e3 * (dense + drafter + experts) / HBM_BYTES_PER_S
    return {
        "moe_distinct_experts_mean": float(distinct.mean()),
        "moe_distinct_experts_max": int(distinct.max()),
        "moe_distinct_experts": distinct.tolist(),
        "moe_verify_tokens": int(tokens),
        "bytes_floor_ms": floor_ms,
        "floor_ratio": round_ms / floor_ms,
        "bytes_floor": {"dense_target": dense, "drafter": drafter, "experts": experts, "one_expert": expert,
                        "bandwidth": HBM_BYTES_PER_S},
    }


def every(x) -> jax.Array:
    """A float32 scalar that depends on every element of every array of x: what a stage-loop pass
    adds to its carry, so that XLA computes all of the stage (an optimization barrier around a
    result of which one element is used still let it drop the rest)."""
    return sum(jnp.sum(leaf, dtype=jnp.float32) for leaf in jax.tree_util.tree_leaves(x))


def tree_pass(acc, logp, state, vocab=None, *, spec) -> jax.Array:
    """One tree-stage pass of stage_loop_times: the whole tree (a pass that used one token of it
    let XLA drop the ancestor mask, 4 x 48 us a round at B = 1024 on the H200)."""
    logp, acc = jax.lax.optimization_barrier((logp, acc))
    return acc + every(jax.lax.optimization_barrier(engine.tree_stage(logp, state, vocab, spec=spec)))


def stage_loop_times(gen: Generator, spec, state, knobs, rounds: int, repeats: int,
                     only: tuple[str, ...] | None = None) -> dict[str, list[float]]:
    """Each stage of the round alone in a device loop, as the fused loop runs it: steady ms per
    stage (a loop of 2R passes minus one of R, over R), one per repeat. No host dispatch per
    pass (the synced stage_times pays one per stage call: ~800 parameter buffers for the 8B
    pair, so its figures are host-bound). The stages run on one round's intermediates (draft ->
    tree -> verify + choose -> walk -> commit, made once from `state`); every pass depends on the
    one before through an optimization barrier over its inputs and its outputs, so XLA can
    neither hoist it out of the loop nor drop any of it. Commit carries the state from pass to
    pass (its writes land where the next round's would). verify = the target forward over root +
    tree, the LM head and the token choice: round_ms_steady minus it is the round's overhead
    beyond the verify."""
    tcfg, dcfg = gen.tcfg, gen.dcfg
    bar = jax.lax.optimization_barrier
    fns = profile.stage_functions(tcfg, dcfg, spec)
    names = [n for n in (("draft", "tree") if spec.speculative else ()) + ("verify", "walk", "commit")
             if only is None or n in only]
    logp = fns["draft"](gen.tparams, gen.dparams, state) if spec.speculative else None
    vocab = engine.draft_vocab(gen.dparams)
    tree = fns["tree"](logp, state, vocab) if spec.speculative else engine.root_tree(state)
    if "walk" in names or "commit" in names:  # their inputs: one verify, token choice and walk
        logits, tapped, new_kv = fns["verify"](gen.tparams, state, tree)
        target_tokens = fns["choose"](logits, state.key, knobs, engine.draw_positions(state, tree))
        result = jax.block_until_ready(fns["walk"](tree, target_tokens))
        del logits
    depth = dcfg.depth if spec.speculative else 0
    slots = engine.num_nodes(spec, dcfg) + 1
    f32 = jnp.float32

    def draft(acc, tp, dp, st):
        st, acc = bar((st, acc))
        return acc + bar(engine.draft_stage(tp, dp, st, tcfg=tcfg, dcfg=dcfg, spec=spec))[0, 0, 0]

    tree_ = functools.partial(tree_pass, spec=spec)

    def verify(acc, tp, st, tr, kn):
        tr, acc = bar((tr, acc))
        lg, _, _ = engine.verify_stage(tp, st, tr, tcfg=tcfg, dcfg=dcfg, spec=spec)
        return acc + every(bar(engine.choose_tokens(st.key, lg, spec.sampling, kn.temperature, kn.top_p,
                                                    engine.draw_positions(st, tr),
                                                    spec.tuning.kernels.deterministic)))

    def walk_(acc, tr, tt):
        tt, acc = bar((tt, acc))
        return acc + bar(engine.walk(tr, tt, depth)).num_accepted[0].astype(f32)

    def commit(st, dp, kv, tp_, res, kn):
        (kv, tp_, res), st = bar(((kv, tp_, res), st))
        return engine.commit_stage(dp, st, kv, tp_, res, kn, dcfg=dcfg, spec=spec, slots=slots)

    zero = jnp.float32(0)
    setups = {  # name: (one pass, the loop's initial carry, the loop-invariant inputs)
        "draft": lambda: (draft, zero, (gen.tparams, gen.dparams, state)),
        "tree": lambda: (tree_, zero, (logp, state, vocab)),
        "verify": lambda: (verify, zero, (gen.tparams, state, tree, knobs)),
        "walk": lambda: (walk_, zero, (tree, target_tokens)),
        "commit": lambda: (commit, state, (gen.dparams, new_kv, tapped, result, knobs)),
    }
    out = {}
    for name in names:
        step, carry, consts = setups[name]()

        def passes(n, carry, *consts, step=step):
            return jax.lax.fori_loop(0, n, lambda _, c: step(c, *consts), carry)

        run = jax.jit(passes).lower(jnp.int32(rounds), carry, *consts).compile(compiler_options=gen.round_options(spec))

        def call(n: int) -> float:
            t0 = time.perf_counter()
            jax.block_until_ready(run(jnp.int32(n), carry, *consts))
            return 1e3 * (time.perf_counter() - t0)

        call(rounds), call(2 * rounds)
        times = []
        for _ in range(repeats):
            t1, t2 = call(rounds), call(2 * rounds)
            times.append((t2 - t1) / rounds)
        out[name] = times
    return out


def stage_times(gen: Generator, spec, refill, knobs, repeats: int) -> dict:
    """ms per stage of a round, each stage a separate call followed by a sync: the rounds of a
    request of `repeats` + 2 tokens (prefilled by refill(None, max_new)) through
    `profile.profiled_rounds`, its first round (the stages' compiles) left out. A stage's calls in
    one round add up (verify = the forward + the token choice). {} for repeats 0 (no state made)."""
    if repeats <= 0:
        return {}
    # a round commits at least one token, the prefill one: `repeats` + 1 rounds at most
    state = refill(None, repeats + 2)
    _, stages = profile.profiled_rounds(gen.tparams, gen.dparams, state, knobs, tcfg=gen.tcfg, dcfg=gen.dcfg,
                                        spec=spec, options=gen.round_options(spec))
    return stages if spec.speculative else {k: v for k, v in stages.items() if k not in ("draft", "tree")}


def output_name(model: str, attn_impl: str, batches: list[int]) -> str:
    """The JSON file that main writes under --out."""
    batch = "" if batches == [1] else "_b" + "_".join(map(str, batches))
    return f"round_{model}_{attn_impl.replace(',', '_')}{batch}.json"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench round", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-8b", choices=sorted(SHAPES))
    ap.add_argument("--prompt-len", default="512", help="prompt length(s), comma-separated")
    ap.add_argument("--budgets", default="16,64,256,1024",
                    help="DDTree budgets; 'auto': generate's --budget auto (its per-round choice included)")
    ap.add_argument("--cost-model", default=None, metavar="FILE",
                    help="auto's cost model (default: the one shipped for the device and shape)")
    ap.add_argument("--auto-budgets", default=None,
                    help="the budgets auto chooses among, comma-separated (default: the Generator's)")
    ap.add_argument("--methods", default="ar,dflash,ddtree", help="subset of ar,dflash,ddtree")
    ap.add_argument("--policy", default="ddtree")
    ap.add_argument("--rounds", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stage-repeats", type=int, default=5,
                    help="timed rounds of the synced stage breakdown (profile.profiled_rounds); 0: none (fewer compiles)")
    ap.add_argument("--verify-loop", action="store_true",
                    help="also time the verify pass alone in a device loop (verify_ms_steady: the round's "
                         "overhead beyond it is round_ms_steady - verify_ms_steady; one more compile a row)")
    ap.add_argument("--stage-loop", action="store_true",
                    help="the stage breakdown from each stage alone in a device loop (stage_loop_times; "
                         "verify included), instead of synced stage calls (host-bound on large models); "
                         "four or five more compiles a row")
    ap.add_argument("--attn-impl", default="auto", help="attention impl(s), comma-separated, e.g. pallas,xla")
    ap.add_argument("--matmul-impl", default="auto", help="matmul impl(s), comma-separated, e.g. xla,pallas")
    ap.add_argument("--cache-impl", default="auto", help="cache-write impl(s), comma-separated, e.g. xla,pallas")
    ap.add_argument("--drafter-quant", default="none", help="drafter weights, comma-separated: none,int8")
    ap.add_argument("--moe-experts", default="auto",
                    help="an MoE target's expert impl(s), comma-separated: auto (this device's tuning), or "
                         "gather, dense, ragged, grouped for every pass (gather: decode only, it copies experts)")
    ap.add_argument("--gdn-tree", default="auto",
                    help="a hybrid target's GDN tree verify, comma-separated: auto (this device's tuning), "
                         f"{' or '.join(GDN_TREE_FORMS)} (KernelTuning.gdn_tree)")
    ap.add_argument("--deterministic", default="off",
                    help="off, on, or off,on: the default kernels, the deterministic mode's (Generator's "
                         "deterministic=True, its impls its own), or both in one call")
    ap.add_argument("--draft-vocab", type=int, default=0,
                    help="draft over a token map of this many ids (the first N; timing only: random weights "
                         "have no frequent tokens); 0: the whole vocabulary")
    ap.add_argument("--unroll", type=int, default=0, help="rounds per loop iteration (0: the default)")
    ap.add_argument("--xla-option", action="append", default=None, metavar="KEY=VALUE",
                    help="XLA option for the executables (repeatable), e.g. xla_gpu_enable_command_buffer=")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--batch", default="1", help="prompts decoded together (rows of one round), comma-separated")
    ap.add_argument("--fresh-buffers", action="store_true",
                    help="each timed call's state in new buffers (new caches, a prefill); by default a call "
                         "prefills into the last call's state, as generate does")
    ap.add_argument("--tp", type=int, default=1,
                    help="devices the model is sharded over (generate's --tp); each row then also reports a "
                         "device's bytes floor plus the round's measured all-reduces (tp_floor_ms)")
    ap.add_argument("--out", default=None, help="directory for round_MODEL_IMPL.json (rewritten after every row)")
    args = ap.parse_args(argv)
    if not 1 <= args.tp <= len(jax.devices()):
        ap.error(f"--tp must be 1..{len(jax.devices())}, the devices here (got {args.tp})")
    dets = [{"off": False, "on": True}.get(d) for d in args.deterministic.split(",") if d]
    if not dets or None in dets:
        ap.error(f"--deterministic takes off, on or off,on (got {args.deterministic!r})")
    moe_impls = [m for m in args.moe_experts.split(",") if m]
    if not moe_impls or any(m not in ("auto", *MOE_EXPERT_IMPLS) for m in moe_impls):
        ap.error(f"--moe-experts takes auto or {', '.join(MOE_EXPERT_IMPLS)}, comma-separated (got {args.moe_experts!r})")
    gdn_forms = [m for m in args.gdn_tree.split(",") if m]
    if not gdn_forms or any(m not in ("auto", *GDN_TREE_FORMS) for m in gdn_forms):
        ap.error(f"--gdn-tree takes auto or {', '.join(GDN_TREE_FORMS)}, comma-separated (got {args.gdn_tree!r})")
    try:
        batches = [int(b) for b in args.batch.split(",") if b]
    except ValueError:
        ap.error(f"--batch takes integers, comma-separated (got {args.batch!r})")
    if not batches or min(batches) < 1:
        ap.error(f"--batch must be >= 1 (got {args.batch})")
    if args.draft_vocab < 0:
        ap.error(f"--draft-vocab must be >= 0 (got {args.draft_vocab})")
    methods = [m for m in args.methods.split(",") if m]
    runs = [(m, 0) for m in ("ar", "dflash") if m in methods]
    try:
        runs += [("ddtree", b) for b in parse_budgets(args.budgets, auto=True) if "ddtree" in methods]
        auto_budgets = {} if args.auto_budgets is None else {"auto_budgets": tuple(parse_budgets(args.auto_budgets))}
    except ValueError as e:
        ap.error(f"--budgets / --auto-budgets: {e}")

    dtype = jnp.dtype(args.dtype)
    set_mem_fraction(args.model)
    t_start = time.perf_counter()
    ck = build(args.model, dtype, args.tp)
    mem = device_memory()
    print(f"[bench_round] {args.model} weights ready in {time.perf_counter() - t_start:.1f}s on "
          f"{jax.devices()[0].device_kind}; target {nbytes(ck.target_params) / 1e9:.2f} GB, drafter "
          f"{nbytes(ck.drafter_params) / 1e9:.2f} GB" + (f"; device {mem['in_use'] / 2**30:.2f} GiB in use of "
                                                        f"{mem['limit'] / 2**30:.2f}" if mem else ""), flush=True)
    opts = xla_options(args.xla_option)
    floor_ms = 1e3 * (nbytes(ck.target_params) + nbytes(ck.drafter_params)) / 3.3e12
    out = {
        "model": args.model, "dtype": args.dtype, "attn_impl": args.attn_impl, "matmul_impl": args.matmul_impl,
        "cache_impl": args.cache_impl, "drafter_quant": args.drafter_quant, "deterministic": args.deterministic,
        "batch": batches[0] if len(batches) == 1 else batches,
        "draft_vocab": args.draft_vocab or None,
        "device": jax.devices()[0].device_kind, "jax": jax.__version__,
        # the shape a cost model fit from these rows is for (python -m bench fit-cost)
        "signature": dataclasses.asdict(ModelSignature.of(ck.target_cfg, ck.drafter_cfg, dtype)),
        "target_bytes": nbytes(ck.target_params), "drafter_bytes": nbytes(ck.drafter_params),
        "weight_read_floor_ms_at_3.3TBps": floor_ms, "device_memory_after_build": mem, "tp": args.tp, "rows": [],
    }
    name = output_name(args.model, args.attn_impl, batches)

    def save():  # rewritten after every row, so a killed run keeps what it measured
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / name).write_text(json.dumps(out, indent=1))

    for prompt_len in (int(x) for x in args.prompt_len.split(",") if x):
        impls = [(a, m, c, q, d, e, f) for a in args.attn_impl.split(",") if a for m in args.matmul_impl.split(",") if m
                 for c in args.cache_impl.split(",") if c for q in args.drafter_quant.split(",") if q
                 for d in dets for e in moe_impls for f in gdn_forms]
        for impl, mm_impl, c_impl, quant, det, moe_impl, gdn_form in impls:
            here = tuning_for()
            chosen = {**({} if moe_impl == "auto" else {"moe_experts": moe_impl, "moe_gather_max": 0}),
                      **({} if gdn_form == "auto" else {"gdn_tree": gdn_form})}
            tuning = dataclasses.replace(here, kernels=dataclasses.replace(here.kernels, **chosen)) if chosen else None
            tag = "".join(f"/{k}={v}" for k, v in (("moe", moe_impl), ("gdn", gdn_form)) if v != "auto")
            made = None
            for (method, budget), batch in ((run, b) for run in runs for b in batches):
                if quant != "none" and method == "ar":
                    continue  # AR has no drafter
                t0 = time.perf_counter()
                vocab = list(range(args.draft_vocab)) if args.draft_vocab and method != "ar" else None
                if made != (method, budget):  # one generator a run, for all its batches
                    gen = Generator(ck, method=method, policy=args.policy, budget=budget or 64, attn_impl=impl,
                                    matmul_impl=mm_impl, cache_impl=c_impl, drafter_quant=quant, unroll=args.unroll,
                                    compiler_options=opts, draft_vocab=vocab, deterministic=det, tuning=tuning,
                                    tp=args.tp,
                                    **({"cost_model": args.cost_model, **auto_budgets} if budget == "auto" else {}))
                    made = (method, budget)
                try:
                    r = measure(gen, prompt_len, args.rounds, args.repeats, args.stage_repeats, batch,
                                verify_loop=args.verify_loop, stage_loop=args.stage_loop,
                                fresh_buffers=args.fresh_buffers)
                except Exception as e:  # one row that fails to compile or run must not cost the others
                    msg = (f"P={prompt_len} x{batch} {impl}/mm={mm_impl}/kv={c_impl}/dq={quant}{tag}{'/det' * det} {method} "
                           f"B={budget}: "
                           f"{type(e).__name__}: {e}")
                    out.setdefault("errors", []).append(msg[:2000])
                    print(f"[bench_round] FAILED {msg[:400]}", flush=True)
                    save()
                    continue
                mem = device_memory()  # the process's peak so far: what the largest row needed
                r.update(device_peak_bytes=mem and mem["peak"], method=method, budget="auto" if gen.auto else gen.budget, policy=gen.policy_name, prompt_len=prompt_len,
                         attn_impl=impl, matmul_impl=mm_impl, cache_impl=c_impl, drafter_quant=quant, batch=batch,
                         draft_vocab=gen.draft_vocab_size, fresh_buffers=args.fresh_buffers, deterministic=det,
                         moe_experts=moe_impl, gdn_tree=gdn_form)
                if args.tp > 1:
                    r.update(tp_round_floor(gen, ck, r, batch, dtype))
                out["rows"].append(r)
                st = " ".join(f"{k}={v:.3f}" for k, v in r["stage_ms"].items())
                dv = f"/dv={gen.draft_vocab_size}" if gen.draft_vocab_size else ""
                print(f"[bench_round] P={prompt_len} x{batch} {impl}/mm={mm_impl}/kv={c_impl}/dq={quant}{dv}{tag}"
                      f"{'/det' * det} {method:6s} B={'auto' if gen.auto else gen.budget:>5} N={r['nodes']:5d} round "
                      f"{r['round_ms_median']:.3f} ms, steady {r['round_ms_steady']:.3f}, a call's fixed "
                      f"{r['call_fixed_ms']:.1f} ms"
                      + (f", verify alone {r['verify_ms_steady']:.3f} (beyond it "
                         f"{r['round_ms_steady'] - r['verify_ms_steady']:.3f} = "
                         f"{100 * (1 - r['verify_ms_steady'] / r['round_ms_steady']):.0f} %)"
                         if r["verify_ms_steady"] else "") + " (all "
                      f"{['%.3f' % x for x in r['round_ms_all']]}) stages: {st}"
                      + (f"; experts a layer {r['moe_distinct_experts_mean']:.1f} (max "
                         f"{r['moe_distinct_experts_max']}), bytes floor {r['bytes_floor_ms']:.4g} ms, steady "
                         f"x{r['floor_ratio']:.2f}" if "bytes_floor_ms" in r else "")
                      + (f"; --tp {args.tp}: all-reduces {r['allreduce_ms_per_round']:.3f} ms, floor "
                         f"{r['tp_floor_ms']:.3f} ms a device, steady x{r['tp_floor_ratio']:.2f}"
                         if args.tp > 1 else "")
                      + (f"; cache {r['cache_bytes'] / 2**20:.4g} MiB (recurrent states "
                         f"{r['recurrent_state_bytes'] / 2**20:.4g}), a verify leaves "
                         f"{r['verify_state_bytes'] / 2**20:.4g} MiB" if "cache_bytes" in r else "")
                      + f"  [{time.perf_counter() - t0:.0f}s, "
                      f"at {time.perf_counter() - t_start:.0f}s]", flush=True)
                save()
    if args.out and out["rows"]:
        try:
            from bench.plots import round_latency
        except ImportError as e:  # matplotlib is not on every device image
            print(f"[bench_round] no plot ({e}); draw it elsewhere: python -m bench plots {args.out}/{name}")
        else:
            print(f"[bench_round] plot: {round_latency(out, Path(args.out) / 'round_latency.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
