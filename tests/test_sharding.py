"""`--tp N`: the model sharded over N devices (ddtree_jax/sharding.py) generates exactly what one
device does.

The test process has initialised JAX with one CPU device, so every case runs in one child process
with four forced host devices (`--xla_force_host_platform_device_count=4`); the child prints its
results as JSON and the checks run here. Models: a tiny dense Qwen3 pair (4 heads, 4 kv heads, a
vocabulary of 384: embedding and head sharded by vocabulary), a tiny Qwen3-MoE pair (8 experts,
tied embeddings, a vocabulary of 386: by vocabulary on 2 devices, replicated on 4) and a tiny
Qwen3.5-MoE hybrid pair (a Gated DeltaNet and a gated attention layer; 2 kv heads: 2 devices), all
read from Hugging Face files without converting. One layer each: the compilations are most of the time.
The Pallas attention and norm kernels run per shard (jax.shard_map) in their interpret mode on the
dense pair, and on a GQA attention call of their own; the Gated DeltaNet recurrence kernel in the
hybrid's recurrent tree verify, and on a call of its own. `bench round --tp 2` runs there too.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import FAST_COMPILE_FLAGS, ROOT
from hf_fixtures import make_drafter, make_hybrid_target, make_target

PROMPTS = [[5, 17, 42, 9, 77, 3, 120, 8], [200, 11, 64]]
MAX_NEW = 20
# Four host devices; the suite's cheapest compile, for one and four devices alike: compiling is most of the time
XLA_FLAGS = f"--xla_force_host_platform_device_count=4 {FAST_COMPILE_FLAGS}"
SIZES = dict(hidden=64, layers=1, heads=4, kv_heads=4, head_dim=16, intermediate=128, max_position=256)
PALLAS_RUNS = ((2, ("ar", "dflash", "ddtree")), (4, ("ddtree",)))   # (tp, methods) with the Pallas kernels


def head_gathers(hlo: str, head_dim: int) -> list[str]:
    """The result shapes of an HLO text's all-gathers of head-shaped data (last dim the head dim):
    q, k, v, the caches or an attention output collected from the devices that hold their heads."""
    shapes = re.findall(r"= (\w+\[[\d,]*\])(?:\{[^}]*\})? all-gather\(", hlo)
    return sorted({s for s in shapes if s.endswith(f",{head_dim}]")})


def child(dense_target: str, dense_draft: str, moe_target: str, moe_draft: str, hybrid_target: str,
          hybrid_draft: str) -> dict:
    """Every case, on four forced CPU devices; returns what the parent checks."""
    import contextlib
    import io

    import jax

    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ddtree_jax import cli, sharding
    from ddtree_jax.checkpoint import load_hf
    from ddtree_jax.errors import UserError, cli_main
    from ddtree_jax.generator import Executables, Generator
    from ddtree_jax.kernels import dispatch
    from ddtree_jax.kernels.attention_reference import attention_reference
    from ddtree_jax.tuning import KernelTuning, tuning_for

    assert len(jax.devices()) == 4, jax.devices()
    out: dict = {"greedy": {}, "sampled": {}, "placement": {}, "errors": {}, "kernels": {}}

    def sharded_axis(spec) -> int | None:
        return next((i for i, a in enumerate(spec) if a is not None), None)

    def tokens(gen, **kw):
        return [r.token_ids for r in gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW, **kw)]

    for name, target, draft in (("dense", dense_target, dense_draft), ("moe", moe_target, moe_draft)):
        ckpt = lambda: load_hf(target, draft, lazy=True)  # noqa: E731 (lazy trees are read once)
        out["greedy"][f"{name} ar tp1"] = tokens(Generator(ckpt(), method="ar"))
        for tp in (2, 4):
            shared = Executables()  # DFlash's and DDTree's prefill is one executable
            for method in ("ar", "dflash", "ddtree"):
                gen = Generator(ckpt(), method=method, budget=12, tp=tp, executables=shared)
                out["greedy"][f"{name} {method} tp{tp}"] = tokens(gen)
                if method == "ddtree":
                    layer = gen.tparams["layers"][0]
                    arrays = dict(q=layer["q"], o=layer["o"], embed=gen.tparams["embed"], cache=gen._kept.cache.k,
                                  dcache=gen._kept.dcache.k, draft_q=gen.dparams["layers"][0]["q"])
                    arrays.update({k: layer[k] for k in ("experts_gate_up", "experts_down", "router", "down")
                                   if k in layer})
                    # the axis each is cut along (None: replicated), and a device's share of q
                    out["placement"][f"{name} tp{tp}"] = {
                        **{k: sharded_axis(x.sharding.spec) for k, x in arrays.items()},
                        "q shard": list(layer["q"].addressable_shards[0].data.shape)}

    # a hybrid MoE target (Gated DeltaNet and gated attention layers, experts and a shared expert)
    hybrid = lambda: load_hf(hybrid_target, hybrid_draft, lazy=True)  # noqa: E731
    out["greedy"]["hybrid ar tp1"] = tokens(Generator(hybrid(), method="ar"))
    shared = Executables()
    for method in ("ar", "dflash", "ddtree"):
        gen = Generator(hybrid(), method=method, budget=12, tp=2, executables=shared)
        out["greedy"][f"hybrid {method} tp2"] = tokens(gen)
    linear, attn, cache = gen.tparams["layers"][0]["linear"], gen.tparams["layers"][1], gen._kept.cache
    out["placement"]["hybrid tp2"] = {k: sharded_axis(x.sharding.spec) for k, x in {
        **{k: linear[k] for k in ("qkv", "z", "b", "a", "A_log", "conv", "norm", "out")}, "qg": attn["qg"],
        "experts_down": attn["experts_down"], "shared_down": attn["shared_down"], "conv_state": cache.conv,
        "rec_state": cache.rec, "kv": cache.kv.k}.items()}
    # the tree verify's recurrent form: the Gated DeltaNet recurrence kernel (interpreted) per shard
    here = tuning_for()
    recurrent = dataclasses.replace(here, kernels=dataclasses.replace(here.kernels, gdn_tree="recurrent"))
    gen = Generator(hybrid(), method="ddtree", budget=12, tp=2, tuning=recurrent)
    out["greedy"]["hybrid ddtree tp2 recurrent"] = tokens(gen)
    # the recurrence kernel per shard (each device its key and value heads) against one device: a chain of 5
    keys = jax.random.split(jax.random.PRNGKey(1), 6)
    bt, n, d = 2, 5, 16
    q, k = (jax.random.normal(key, (bt, n, 2, d)) for key in keys[:2])
    v = jax.random.normal(keys[2], (bt, n, 4, d))
    g, beta = -jax.nn.softplus(jax.random.normal(keys[3], (bt, n, 4))), jax.random.uniform(keys[4], (bt, n, 4))
    s0, chain = jax.random.normal(keys[5], (bt, 4, d, d)), jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (bt, n))
    one = KernelTuning(gdn_tree="recurrent")
    want = dispatch.gdn_recurrence(one, q, k, v, g, beta, chain, chain, s0)
    mesh = sharding.make_mesh(2)
    specs = (P(None, None, "tp"),) * 5 + (P(), P(), P(None, "tp"))
    args = [jax.device_put(x, NamedSharding(mesh, spec))
            for x, spec in zip((q, k, v, g, beta, chain, chain, s0), specs)]
    got = jax.jit(lambda *a: dispatch.gdn_recurrence(dataclasses.replace(one, mesh=mesh), *a))(*args)
    out["kernels"]["gdn per shard"] = {"error": max(float(jnp.abs(a - b).max()) for a, b in zip(got, want)),
                                       "axes": [sharded_axis(x.sharding.spec) for x in got]}
    try:
        Generator(hybrid(), method="ddtree", tp=4)
        out["errors"]["api hybrid tp4"] = "no error"
    except UserError as e:
        out["errors"]["api hybrid tp4"] = str(e)

    ckpt = lambda: load_hf(dense_target, dense_draft, lazy=True)  # noqa: E731
    # the interpreted Pallas attention and norm kernels, per shard: tokens, and the round's gathers
    for tp, methods in PALLAS_RUNS:
        shared = Executables()
        for method in methods:
            before = set(shared)
            gen = Generator(ckpt(), method=method, budget=12, tp=tp, attn_impl="pallas_interpret", executables=shared)
            out["greedy"][f"dense {method} tp{tp} pallas"] = tokens(gen)
            [hlo] = [v.as_text() for k, v in shared.items() if k[0] == "rounds" and k not in before]
            out["kernels"][f"tp{tp} {method}"] = {
                "gathers": head_gathers(hlo, SIZES["head_dim"]),
                **{name: name in hlo for name in ("ddtree_attention", "ddtree_add_rms_norm", "ddtree_qk_norm_rope")},
                "impls": [gen.attn_impl, gen.tuning.kernels.norm_impl, gen.matmul_impl, gen.cache_impl]}

    # one GQA attention call (8 query heads, 4 kv heads, a stacked cache): per shard against one device,
    # and the same kernel left to GSPMD, which gathers heads (what the round's check would catch)
    mesh = sharding.make_mesh(2)
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    bt, t, s, dh = 2, 5, 32, SIZES["head_dim"]
    q, k_new, v_new = (jax.random.normal(key, (bt, t, h, dh)) for key, h in zip(keys, (8, 4, 4)))
    k_cache, v_cache = (jax.random.normal(key, (2, bt, 4, s, dh)) for key in keys[3:])
    cache_len, mask = jnp.asarray([7, 20], jnp.int32), jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (bt, t, t))
    heads, cache = P(None, None, "tp", None), P(None, None, "tp", None, None)
    args = [jax.device_put(x, NamedSharding(mesh, spec)) for x, spec in
            zip((q, k_new, v_new, k_cache, v_cache, cache_len, mask), (heads,) * 3 + (cache,) * 2 + (P(),) * 2)]
    want = attention_reference(q, k_new, v_new, k_cache, v_cache, cache_len, mask, scale=0.25, layer=1)
    for name, kernels in (("per shard", KernelTuning(attention="pallas_interpret", mesh=mesh)),
                          ("gspmd", KernelTuning(attention="pallas_interpret"))):
        f = jax.jit(lambda *a, kernels=kernels: dispatch.attention(kernels, *a, scale=0.25, layer=1))
        got = f(*args)
        out["kernels"][f"gqa {name}"] = {"error": float(jnp.abs(got - want).max()),
                                         "axis": sharded_axis(got.sharding.spec),
                                         "gathers": head_gathers(f.lower(*args).compile().as_text(), dh)}

    sampled = dict(temperature=0.8, top_p=0.9, seed=7)
    for tp in (1, 2):
        out["sampled"][f"ddtree tp{tp}"] = tokens(Generator(ckpt(), method="ddtree", budget=12, tp=tp), **sampled)

    def cli_error(*argv) -> str:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = cli_main(cli.main, ["--target", dense_target, "--draft", dense_draft, "--prompt", "x", *argv])
        return f"{rc} {err.getvalue().strip()}"

    out["errors"]["cli tp3"] = cli_error("--tp", "3")
    out["errors"]["cli tp8"] = cli_error("--tp", "8")
    out["errors"]["cli tp0"] = cli_error("--tp", "0")
    out["errors"]["cli tpx"] = cli_error("--tp", "two")

    def api_error(**kw) -> str:
        try:
            Generator(load_hf(dense_target, dense_draft, lazy=True), **kw)
        except UserError as e:
            return str(e)
        return "no error"

    out["errors"]["api tp3"] = api_error(tp=3)
    out["errors"]["api pallas"] = api_error(tp=2, matmul_impl="pallas_interpret", cache_impl="pallas_interpret")
    pair = load_hf(dense_target, dense_draft, lazy=True)
    weights = sum(sharding.weight_bytes_per_device(p, 1) for p in (pair.target_params, pair.drafter_params))
    os.environ["DDTREE_MEMORY_LIMIT_BYTES"] = str(weights * 3 // 4)   # the weights alone overflow one device
    out["errors"]["api memory tp1"] = api_error(tp=1)
    # --tp auto (AR: the target alone): its weights and one request's caches fit two devices, not one
    need = (sharding.weight_bytes_per_device(pair.target_params, 1)
            + sharding.cache_bytes_per_device(pair.target_cfg, None, pair.target_cfg.max_position, 4, 1))
    os.environ["DDTREE_MEMORY_LIMIT_BYTES"] = str(need * 3 // 4)
    out["auto"] = Generator(load_hf(dense_target, dense_draft, lazy=True), method="ar", tp="auto").tp
    del os.environ["DDTREE_MEMORY_LIMIT_BYTES"]

    # bench round --tp 2 on the tiny shape: a device's bytes floor and the round's all-reduces
    import tempfile
    from pathlib import Path

    from bench import bench_round
    with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
        bench_round.main(["--model", "tiny", "--methods", "ar,ddtree", "--budgets", "8", "--rounds", "2",
                          "--repeats", "1", "--stage-repeats", "0", "--tp", "2", "--out", d])
        [rows] = [json.loads(f.read_text())["rows"] for f in Path(d).glob("round_*.json")]
        try:
            bench_round.main(["--tp", "5"])
        except SystemExit as e:
            out["errors"]["bench tp5"] = e.code
    out["bench"] = [{k: r[k] for k in ("method", "tp", "allreduce_ms_per_round", "tp_floor_ms",
                                       "tp_weight_bytes_per_device")} for r in rows]
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("tp")
    dense = make_target(d / "dense", "qwen3", vocab=384, **SIZES)
    dense_draft = make_drafter(d / "dense_draft", dense, layers=1, block_size=8, target_layer_ids=[0])
    moe = make_target(d / "moe", "qwen3_moe", vocab=386, tie=True, experts=8, top_k=2, expert_intermediate=32,
                      norm_topk_prob=True, **SIZES)
    moe_draft = make_drafter(d / "moe_draft", moe, layers=1, block_size=8, target_layer_ids=[0])
    hybrid = make_hybrid_target(d / "hybrid", vocab=384, layer_types=["linear_attention", "full_attention"],
                                experts=8, top_k=2)
    hybrid_draft = make_drafter(d / "hybrid_draft", hybrid, layers=1, block_size=8, target_layer_ids=[0, 1],
                                intermediate=64)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=XLA_FLAGS,
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    env.pop("DDTREE_MEMORY_LIMIT_BYTES", None)
    args = map(str, (dense, dense_draft, moe, moe_draft, hybrid, hybrid_draft))
    r = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_greedy_is_token_identical_to_one_device(results):
    greedy = results["greedy"]
    for name in ("dense", "moe"):
        want = greedy[f"{name} ar tp1"]
        assert all(len(t) == MAX_NEW for t in want), want
        for tp in (2, 4):
            for method in ("ar", "dflash", "ddtree"):
                assert greedy[f"{name} {method} tp{tp}"] == want, f"{name} {method} on {tp} devices"


def test_a_hybrid_target_on_two_devices_is_token_identical_to_one(results):
    """Gated DeltaNet layers with per-head projections cut by heads, gated attention, an MoE block
    with a shared expert: the greedy tokens of one device for every method; kv heads (2) bound --tp."""
    greedy = results["greedy"]
    want = greedy["hybrid ar tp1"]
    assert all(len(t) == MAX_NEW for t in want), want
    for method in ("ar", "dflash", "ddtree"):
        assert greedy[f"hybrid {method} tp2"] == want, f"hybrid {method} on 2 devices"
    assert greedy["hybrid ddtree tp2 recurrent"] == want, "the recurrent tree verify on 2 devices"
    assert results["placement"]["hybrid tp2"] == dict(qkv=1, z=1, b=1, a=1, A_log=0, conv=0, norm=None, out=0, qg=1,
                                                       experts_down=0, shared_down=0, conv_state=3, rec_state=2, kv=2)
    assert results["kernels"]["gdn per shard"] == {"error": 0.0, "axes": [2, 1]}   # o by heads, states by heads
    assert "--tp 4 does not divide the target's kv heads (2)" in results["errors"]["api hybrid tp4"]


def test_tp_auto_sizes_a_hybrid_target_by_its_weights_and_caches():
    """--tp auto on a hybrid target: the fewest devices that divide it and hold its weights and one
    request's caches (KV caches and recurrent states); no parent device needed."""
    from bench import bench_round

    from ddtree_jax import sharding
    from ddtree_jax.models.family import family_of
    from ddtree_jax.models.hybrid import HybridConfig

    cfg = HybridConfig.from_hf(bench_round.hf_config("tiny-hybrid"))
    positions = min(4096, cfg.max_position)
    cache = family_of(cfg).cache_bytes(cfg, 1, positions, 2)
    weights = 40 * cache
    assert sharding.cache_bytes_per_device(cfg, None, positions, 2, 2) == cache // 2
    fits_two = (weights + cache) // 2 + 1
    assert sharding.auto_tp(cfg, None, lambda n: weights // n, 2, fits_two, 4) == 2
    assert sharding.auto_tp(cfg, None, lambda n: weights // n, 2, weights + cache, 4) == 1
    assert sharding.auto_tp(cfg, None, lambda n: weights // n, 2, None, 4) == 1   # memory unknown: one device


def test_pallas_kernels_run_per_shard(results):
    """The interpreted Triton attention and the norm kernels under --tp: the tokens of one device,
    and no head-shaped all-gather in the round (the caches, q/k/v and the attention's output stay
    on the devices that hold their heads)."""
    want = results["greedy"]["dense ar tp1"]
    for tp, methods in PALLAS_RUNS:
        for method in methods:
            assert results["greedy"][f"dense {method} tp{tp} pallas"] == want, f"{method} on {tp} devices, Pallas"
            k = results["kernels"][f"tp{tp} {method}"]
            assert k["gathers"] == [], k
            assert k["impls"] == ["pallas_interpret", "pallas_interpret", "xla", "xla"], k
            assert k["ddtree_attention"] and k["ddtree_add_rms_norm"], k
            assert k["ddtree_qk_norm_rope"] == (method != "ar"), k    # the drafter's q (the target's are XLA's)
    gqa, gspmd = results["kernels"]["gqa per shard"], results["kernels"]["gqa gspmd"]
    assert gqa["error"] < 1e-5 and gqa["gathers"] == [] and gqa["axis"] == 2, gqa      # the output by heads
    assert gspmd["error"] < 1e-5 and gspmd["gathers"], gspmd   # the check sees a gather where there is one


def test_bench_round_reports_a_devices_floor_and_its_all_reduces(results):
    """`bench round --tp 2`: the weights placed as --tp places them, each row a device's share of
    the weights its round reads (the drafter's too beside the target's) and the measured all-reduces."""
    ar, ddtree = results["bench"]
    assert (ar["method"], ddtree["method"], ar["tp"], ddtree["tp"]) == ("ar", "ddtree", 2, 2)
    for r in (ar, ddtree):
        assert 0 < r["allreduce_ms_per_round"] < r["tp_floor_ms"], r
    assert 0 < ar["tp_weight_bytes_per_device"] < ddtree["tp_weight_bytes_per_device"]
    assert results["errors"]["bench tp5"] == 2   # more devices than the host has: argparse's exit 2


def test_weights_and_caches_are_sharded(results):
    p = results["placement"]
    for name in ("dense", "moe"):
        for tp in (2, 4):
            got = p[f"{name} tp{tp}"]
            # q by columns (heads), o by rows, both caches [L, Bt, Hkv, S, Dh] by kv heads
            assert (got["q"], got["draft_q"], got["o"], got["cache"], got["dcache"]) == (1, 1, 0, 2, 2), got
            assert got["q shard"] == [SIZES["hidden"], SIZES["heads"] * SIZES["head_dim"] // tp], got
    assert p["dense tp4"]["down"] == 0
    assert p["dense tp4"]["embed"] == 0      # 384 = 4 x 96: by vocabulary
    assert p["moe tp2"]["embed"] == 0        # 386 = 2 x 193
    assert p["moe tp4"]["embed"] is None     # 386 does not divide by 4: replicated
    assert (p["moe tp4"]["experts_gate_up"], p["moe tp4"]["experts_down"], p["moe tp4"]["router"]) == (0, 0, None)


def test_seeded_sampling_matches_one_device(results):
    s = results["sampled"]
    assert s["ddtree tp2"] == s["ddtree tp1"]
    assert s["ddtree tp1"] != results["greedy"]["dense ar tp1"]     # it did sample


def test_bad_tp_values_are_one_line(results):
    e = results["errors"]
    assert e["cli tp3"].startswith("2 ") and "--tp 3 does not divide the target's attention heads (4)" in e["cli tp3"]
    assert "use --tp 1 or 2 or 4" in e["cli tp3"] and "\n" not in e["cli tp3"]
    assert e["cli tp8"].startswith("2 ") and "--tp 8 needs 8 devices and this host has 4" in e["cli tp8"]
    assert e["cli tp0"].startswith("2 ") and "--tp" in e["cli tp0"] and ">= 1" in e["cli tp0"]
    assert e["cli tpx"].startswith("2 ") and "'two'" in e["cli tpx"]
    assert "does not divide" in e["api tp3"]
    assert "--matmul-impl pallas_interpret, --cache-impl pallas_interpret" in e["api pallas"], e["api pallas"]
    assert "\n" not in e["api pallas"]
    assert "not enough device memory" in e["api memory tp1"] and "raise --tp" in e["api memory tp1"]
    assert results["auto"] == 2


if __name__ == "__main__":
    print(json.dumps(child(*sys.argv[1:7])))


def test_sharded_kernels_run_grouped_experts_as_dense():
    """GSPMD cannot partition the grouped experts' Pallas product: under a mesh an MoE's experts
    run "dense" (partitioned along the expert axis) and a decode's few tokens gather theirs, the
    products and cache writes on XLA's ops."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from ddtree_jax import sharding
    from ddtree_jax.tuning import GPU_KERNELS

    assert GPU_KERNELS.moe_experts == "grouped"
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    k = sharding.sharded_kernels(GPU_KERNELS, mesh)
    assert GPU_KERNELS.moe_gather_max == 0   # one device: grouped for every pass
    assert (k.moe_experts, k.moe_gather_max, k.matmul, k.cache, k.mesh) == ("dense", 4, "xla", "xla", mesh)
    ragged = sharding.sharded_kernels(dataclasses.replace(GPU_KERNELS, moe_experts="ragged"), mesh)
    assert (ragged.moe_experts, ragged.moe_gather_max) == ("ragged", 0)
