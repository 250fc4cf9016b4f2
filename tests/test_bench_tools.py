"""The GPU measurement scripts in their CPU smoke modes, and the profile parser's pieces."""
from __future__ import annotations

import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import bench_kernels as bk
from bench import profile_round as pr


def test_profile_parser_pieces():
    hlo = """
  %gemm_fusion_dot.12 = bf16[1,8]{1,0} fusion(%a, %b), kind=kCustom, metadata={op_name="jit(_run_rounds)/while/body/verify/layer3/dot_general" deduplicated_name="gemm_fusion_dot.7"}
  ROOT %loop_add_fusion.3 = f32[4] fusion(%c), kind=kLoop, metadata={op_name="jit(_run_rounds)/while/body/tree/add"}
"""
    scopes = pr.op_scopes(hlo)
    assert pr.stage_of(scopes["gemm_fusion_dot.12"]) == "verify"
    assert pr.stage_of(scopes["gemm_fusion_dot_7"]) == "verify"  # kernel name inside a command buffer
    assert pr.stage_of(scopes["loop_add_fusion_3"]) == "tree"
    assert pr.stage_of("jit(f)/while/cond/and") == "other"
    ev = [dict(start=0, dur=10), dict(start=5, dur=10), dict(start=30, dur=5)]
    assert pr.busy_ns(ev) == 20
    assert pr.kind_of("nvjet_sm90_tst_128x72", "") == "matmul"
    events = [dict(name="gemm_fusion_dot_7", start=0, dur=4000, hlo_op="command_buffer_2"),
              dict(name="loop_add_fusion_3", start=100000, dur=1000, hlo_op="loop_add_fusion.3")]
    s = pr.summarize(events, scopes, rounds=1)
    assert s["stages_ms"] == {"tree": 0.001, "verify": 0.004}
    assert s["gaps_over_50us_per_round"] == 1 and s["kernels_per_round"] == 2
    # idle under 50 us is charged to the kernel that waits; the 96 us host gap is not
    events.insert(1, dict(name="Memset 0", start=6000, dur=500, hlo_op=""))
    events.insert(2, dict(name="nvjet_sm90_tst_128x136", start=11000, dur=2000, hlo_op=""))
    s = pr.summarize(events, scopes, rounds=2)
    assert s["idle_before_ms_per_round"] == {"nvjet_sm90_tst_128x136": 0.00225, "Memset 0": 0.001}
    assert s["idle_before_count_per_round"] == {"nvjet_sm90_tst_128x136": 0.5, "Memset 0": 0.5}


def test_untagged_kernels_take_the_stage_around_them():
    """cuBLAS / Pallas kernels have no scope: between two kernels of one stage they are that
    stage's; between two stages, or outside every tag, they stay "other"."""
    got, n = pr.infer_stages(["other", "draft", "other", "draft", "other", "verify", "other", "other",
                              "verify", "other"])
    assert got == ["other", "draft", "draft", "draft", "other", "verify", "verify", "verify", "verify", "other"]
    assert n == 3
    assert pr.infer_stages(["other", "other"]) == (["other", "other"], 0)
    scopes = {"loop_add_fusion_3": "jit(f)/while/body/verify/add"}
    events = [dict(name=n, start=t, dur=1000, hlo_op=op) for n, t, op in (
        ("loop_add_fusion_3", 0, "loop_add_fusion_3"), ("nvjet_sm90_tst_1", 2000, ""),
        ("loop_add_fusion_3", 4000, "loop_add_fusion_3"))]
    s = pr.summarize(events, scopes, rounds=1)
    assert s["stages_ms"] == {"verify": 0.003} and s["kinds_ms"]["verify:matmul"] == 0.001
    assert s["stage_inferred_kernels_per_round"] == 1 and [t[3] for t in s["timeline"]] == ["verify"] * 3


def test_profile_round_smoke(tmp_path):
    assert pr.main(["--model", "tiny", "--methods", "ar,ddtree:8/2", "--rounds", "2", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "profile_tiny.json").read_text())["results"]
    assert [r["label"] for r in res] == ["ar_u1", "ddtree8_u2"]
    for r in res:
        assert r["wall_ms_per_round"] > 0 and r["rounds"] == 2
        assert r["busy_ms_per_round"] > 0 and set(r["stages_ms"]) <= set(pr.STAGES) | {"other"}
    assert (tmp_path / "hlo_ar_u1.txt.xz").stat().st_size > 1000
    assert [r["traced"] for r in res] == ["op by op"] * 2
    assert (tmp_path / "trace_ar_u1.xplane.pb.xz").stat().st_size > 1000
    for r in res:  # host events in the device's idle gaps (on CPU the "device" is the CPU client's ops)
        assert all(h["ms_per_round"] > 0 and h["count_per_round"] > 0 and h["name"] for h in r["host_in_gaps"])


def test_profile_round_graphs_option(tmp_path):
    """--graphs compiles the round with XLA's keep-command-buffers-while-profiling option (an
    option this XLA knows: an unknown one fails the compile) and says so in the results."""
    assert pr.main(["--model", "tiny", "--methods", "ar", "--rounds", "2", "--graphs", "--out", str(tmp_path)]) == 0
    (r,) = json.loads((tmp_path / "profile_tiny.json").read_text())["results"]
    assert r["traced"] == "graphs" and r["rounds"] == 2 and r["busy_ms_per_round"] > 0


def test_bench_tree_and_probe_smoke(tmp_path):
    from bench import bench_tree, probe_decode

    assert bench_tree.main(["--vocab", "512", "--budgets", "8,40", "--inner", "2", "--repeats", "1",
                            "--variants", "8x0t,8x0tr4w2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench_tree.json").read_text())["rows"]
    assert [r["budget"] for r in rows] == [8, 40]
    assert all(r["build_ms_count1024"] > 0 and r["build_ms_count0"] > 0 and r["topk2_ms"] > 0
               and r["topk_8x0t_ms"] > 0 and r["topk_8x0tr4w2_ms"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        bench_tree.main(["--variants", "8x0q"])
    import jax

    from ddtree_jax.trees import ddtree
    if not ddtree.VOCAB_TOPK.get(jax.default_backend()):   # one-stage top-k here: usage errors
        for flag in ("--stage2-max-k", "--stage2-select", "--select-radix"):
            with pytest.raises(SystemExit):
                bench_tree.main([flag, "0,1"])
    assert probe_decode.main(["--small", "--out", str(tmp_path)]) == 0
    probe = json.loads((tmp_path / "probe_decode.json").read_text())
    assert probe["copy_TBps"] > 0 and len(probe["gemv"]) == 2
    assert probe["weights_only_step_io"]["ms"] > 0


def test_probe_call_fixed_smoke(tmp_path):
    """probe_call_fixed times calls in its four state modes (each call's wall-clock start kept,
    --log-calls prints them); donating the whole last state to the prefill ("state") or running
    it on ("continue") keeps every buffer's address, donating only the caches keeps theirs; an
    unknown mode is a usage error."""
    from bench import probe_call_fixed

    assert probe_call_fixed.main(["--model", "tiny", "--rounds", "2", "--repeats", "1", "--log-calls",
                                  "--out", str(tmp_path)]) == 0
    out = json.loads((tmp_path / "call_fixed.json").read_text())
    modes = out["modes"]
    # every call (a warm-up pair and a timed pair a mode) with its rounds, start and time
    assert [(c["mode"], c["rounds"]) for c in out["calls"]] == [
        (m, n) for m in probe_call_fixed.MODES for n in (2, 4, 2, 4)]
    starts = [c["start"] for c in out["calls"]]
    assert starts == sorted(starts) and all(c["ms"] > 0 for c in out["calls"])
    assert list(modes) == list(probe_call_fixed.MODES)
    for name, r in modes.items():
        assert len(r["round_ms_a_call"]) == len(r["call_fixed_ms"]) == 1 and r["round_ms_a_call"][0] > 0, name
        assert len(r["buffers_moved"]) == 2 and r["rounds_done"] > 0, name
    assert modes["state"]["buffers_moved"] == modes["continue"]["buffers_moved"] == [0, 0]
    assert all(m < modes["caches"]["leaves"] for m in modes["caches"]["buffers_moved"])
    with pytest.raises(SystemExit):
        probe_call_fixed.main(["--modes", "fresh,warm"])
    # --dispatch: 0-round calls and the identity, every timing kept
    assert probe_call_fixed.main(["--model", "tiny", "--rounds", "2", "--repeats", "1", "--modes", "state",
                                  "--dispatch", "--out", str(tmp_path)]) == 0
    disp = json.loads((tmp_path / "call_fixed.json").read_text())["dispatch"]
    assert set(disp) == {"zero_made_inside", "zero", "identity", "identity_state_only", "identity_weights_only",
                         "jnp_int32"}
    assert all(len(v) == 5 and min(v) > 0 for v in disp.values())


@pytest.mark.parametrize("flag,values,table,suffixes", [
    ("--ancestor-impl", "square,chain", "ANCESTOR_CHAIN_FROM", ["ancchain", "ancsquare"]),
    ("--onehot-max", "0,100000", "SELECT_ONEHOT_MAX", ["onehot0", "onehot100000"]),
    ("--global-prune", "0,1", "GLOBAL_PRUNE", ["prune0", "prune1"]),
    ("--select-barrier", "0,1", "SELECT_BARRIER", ["barrier0", "barrier1"]),
    ("--beam-kernel-max", "0,1000", "BEAM_KERNEL_MAX", ["beam0", "beam1000"]),
    ("--select-top-from", "0,4", "SELECT_TOP_FROM", ["top0", "top4"]),
    ("--final-merge-from", "0,1", "FINAL_MERGE_FROM", ["merge0", "merge1"]),
    ("--pair-kernel-from", "0,1", "PAIR_KERNEL_FROM", ["pair0", "pair1"]),
    ("--pair-kernel-tile", "16x8w2,32x32", "PAIR_KERNEL_TILE", ["pt16x8w2", "pt32x32"]),
    ("--runs-kernel-from", "0,1", "RUNS_KERNEL_FROM", ["runs0", "runs1"]),
])
def test_bench_tree_setting_rows(tmp_path, flag, values, table, suffixes):
    """--ancestor-impl / --onehot-max / --global-prune / --select-barrier time the whole build
    (ancestor mask included) once per value and restore the setting they vary
    (trees.base.ANCESTOR_CHAIN_FROM, ddtree.SELECT_ONEHOT_MAX, ddtree.GLOBAL_PRUNE,
    ddtree.SELECT_BARRIER); an unknown ancestor impl is a usage error."""
    from bench import bench_tree
    from ddtree_jax.trees import base as trees_base
    from ddtree_jax.trees import ddtree

    setting = getattr(trees_base, table, None) or getattr(ddtree, table)
    before = dict(setting)
    assert bench_tree.main(["--vocab", "128", "--depth", "3", "--budgets", "8", "--inner", "1", "--repeats", "1",
                            "--count-max", "1024", flag, values, "--trace", "--out", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "bench_tree.json").read_text())["rows"]
    assert sorted(k for k in row if k.startswith("build_ms")) == [f"build_ms_count1024_{x}" for x in suffixes]
    # --trace: one traced loop a variant (on the CPU its events are the thunks), nonempty
    traces = [row[f"build_trace_count1024_{x}"] for x in suffixes]
    assert all(t["launches"] > 0 and t["span_us"] > 0 and t["kernels_us"] for t in traces)
    assert setting == before
    if flag == "--ancestor-impl":
        with pytest.raises(SystemExit):
            bench_tree.main([flag, "bits"])


def test_probe_topk_smoke(tmp_path, monkeypatch):
    """bench.probe_topk's stripped-down first-stage kernels run (interpret mode here), write
    their rows, lower for CUDA and verify; an unknown variant is a usage error."""
    from bench import probe_topk
    from test_kernels import _verified_triton_modules

    assert probe_topk.main(["--vocab", "1000", "--rows", "2", "--chunks", "8", "--keep", "8", "--inner", "1",
                            "--repeats", "1", "--no-trace", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "probe_topk.json").read_text())["results"]
    assert [r["variant"] for r in rows] == list(probe_topk.VARIANTS) and all(r["ms"] > 0 for r in rows)
    with pytest.raises(SystemExit):
        probe_topk.main(["--variants", "sort"])
    modules = _verified_triton_modules(monkeypatch)
    for variant in probe_topk.VARIANTS:
        jax.jit(lambda x: probe_topk.probe(x, 128, 64, variant)).trace(
            jax.ShapeDtypeStruct((15, 151936), jnp.float32)).lower(lowering_platforms=("cuda",))
    assert len(modules) == len(probe_topk.VARIANTS) and all(m.operation.verify() for m in modules)


def test_check_tree_smoke(capsys):
    """bench.check_tree (the device check of the tree build's fast paths) with the GPU's
    settings in interpret mode: every build equals plain XLA's, exit 0."""
    from bench import check_tree
    from ddtree_jax.trees import ddtree

    before = (dict(ddtree.VOCAB_TOPK), dict(ddtree.BEAM_KERNEL_MAX), dict(ddtree.SELECT_TOP_FROM))
    assert check_tree.main(["--interpret", "--vocab", "2000", "--depth", "4", "--budgets", "8"]) == 0
    out = capsys.readouterr().out
    assert out.count("equal") >= 6 and "DIFFERENT" not in out and "all equal" in out
    assert (dict(ddtree.VOCAB_TOPK), dict(ddtree.BEAM_KERNEL_MAX), dict(ddtree.SELECT_TOP_FROM)) == before


def test_building_the_bench_model_leaves_the_prng_default_alone():
    """bench_round.build uses a fast generator for random weights through typed keys; the
    process-wide default (which generation's sampling uses) must not change."""
    import jax

    from bench.bench_round import build

    before = jax.config.jax_default_prng_impl
    ck = build("tiny", jax.numpy.float32)
    assert jax.config.jax_default_prng_impl == before
    assert float(abs(ck.target_params["embed"]).sum()) > 0


def test_bench_round_shipped_shape_is_the_shipped_pairs():
    """bench_round --model shipped times the shipped pair's shapes: its table entry must follow
    ddtree_jax/default_model's configs (a retrained pair with other sizes must update it)."""
    import json
    from pathlib import Path

    from bench.bench_round import SHAPES

    hf = Path(__file__).resolve().parents[1] / "ddtree_jax" / "default_model" / "hf"
    t = json.loads((hf / "target" / "config.json").read_text())
    d = json.loads((hf / "draft" / "config.json").read_text())
    s = SHAPES["shipped"]
    assert s["target"] == dict(vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
                               intermediate_size=t["intermediate_size"], num_layers=t["num_hidden_layers"],
                               num_heads=t["num_attention_heads"], num_kv_heads=t["num_key_value_heads"],
                               head_dim=t["head_dim"], max_position=t["max_position_embeddings"],
                               tie_embeddings=t["tie_word_embeddings"])
    assert s["drafter"] == dict(num_layers=d["num_hidden_layers"], block_size=d["block_size"],
                                target_layer_ids=tuple(d["dflash_config"]["target_layer_ids"]))
    assert s["theta"] == t["rope_theta"]


def test_check_gpu_smoke(capsys):
    """bench.check_gpu's comparison runs end to end (Pallas in interpret mode vs XLA) and passes."""
    from bench.check_gpu import main

    assert main(["--impl", "pallas_interpret", "--layers", "1", "--small"]) == 0
    out = capsys.readouterr().out
    assert "T=   5 prefix=   21" in out and "T=  16 prefix=   21" in out and "(ok, tol" in out


def test_check_gpu_smoke_mosaic_interpret(capsys, monkeypatch):
    """The Mosaic GPU kernel (interpret mode) inside target.forward, fed by the model's own cache
    and tree mask, against XLA; the T it cannot take (not a multiple of 8) are skipped by name.

    T = 16 runs its default config (8 key-split CTAs and the merge kernel). The interpreter runs
    each warpgroup as a nested CPU computation, which deadlocked inside the forward on 2 cores
    until conftest (and check_gpu) called prepare_cpu_for_interpret."""
    from bench.check_gpu import main
    from ddtree_jax.kernels import tree_attention_mgpu as mgpu

    monkeypatch.delenv(mgpu.CONFIG_ENV, raising=False)

    assert main(["--impl", "mosaic_interpret", "--layers", "1", "--small"]) == 0
    out = capsys.readouterr().out
    assert "T=   5 prefix=   21 skipped" in out and "T=  16 prefix=   21 mosaic_interpret vs xla" in out
    assert "(ok, tol" in out


def _args(s):
    q = jnp.ones((1, 2, 4, 8), jnp.float32)
    kv = jnp.ones((1, 2, s, 8), jnp.float32)
    return (q, q[:, :, :2], q[:, :, :2], kv, kv, jnp.array([s], jnp.int32), jnp.ones((1, 2, 2), bool))


def test_cold_chain_rotates_over_enough_cache_copies():
    seen = []

    def fn(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask):
        seen.append((k_cache, v_cache))
        return q + k_cache.sum() * 0

    args = _args(64)  # K + V: 2 x 1024 floats = 8 KiB
    assert bk.time_chain(fn, args, inner=6, reps=1, cold_bytes=20_000) > 0
    caches = seen[:6]
    assert len({id(k) for k, _ in caches}) == 3 and len({id(v) for _, v in caches}) == 3  # ceil(20000 / 8192)
    assert caches[0][0] is caches[3][0]

    seen.clear()
    bk.time_chain(fn, args, inner=6, reps=1)  # warm: one cache for every call
    assert len({id(k) for k, _ in seen[:6]}) == 1
    seen.clear()
    bk.time_chain(fn, args, inner=4, reps=1, cold_bytes=10**9)  # at most `inner` copies
    assert len({id(k) for k, _ in seen[:4]}) == 4


def test_trace_chain_reports_device_time_per_call():
    """bench_kernels.trace_chain: the chain's kernels (CPU: the PjRt thunks) per call, their
    sum and the span, from one traced run."""
    def fn(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask):
        return q + (k_cache * q[0, 0, 0, 0]).sum()

    tr = bk.trace_chain(fn, _args(64), inner=4, cold_bytes=20_000)
    assert tr["span_us"] > 0 and tr["busy_us"] > 0 and tr["launches"] > 0
    assert abs(sum(tr["kernels_us"].values()) - tr["busy_us"]) < 1e-6
    assert list(tr["kernels_us"].values()) == sorted(tr["kernels_us"].values(), reverse=True)


def test_probe_prefetch_smoke(tmp_path):
    """bench.probe_prefetch --small runs every row (the side-stream annotation is ignored on CPU)."""
    from bench import probe_prefetch

    assert probe_prefetch.main(["--small", "--fracs", "0.5", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "probe_prefetch.json").read_text())["us_per_layer"]
    assert {"o_cold", "o_warm", "attn+o_cold", "attn+o_cold_pfside1", "attn+o_cold_pfmain1",
            "attn+down_cold", "attn+down_cold_pfside0.5"} <= set(rows)
    assert all(v > 0 for v in rows.values())


def test_probe_read_floor_reads_every_key_once(tmp_path):
    """probe_read_floor's read kernel (interpret mode) sums each chunk's keys of K and V exactly
    once, plus the batch row's seed (what keeps a chain's calls from being merged); a cache that
    does not cut into whole blocks and a malformed config are refused; the --small run times the
    decode attention and every config that fits."""
    from bench import probe_read_floor as prf

    rng = np.random.default_rng(0)
    k = jnp.asarray(rng.standard_normal((2, 3, 256, 16)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((2, 3, 256, 16)), jnp.bfloat16)
    seed = jnp.asarray([0.5, -2.0], jnp.float32)
    got = prf.read_cache(seed, k, v, chunks=2, block_k=32, warps=4, stages=2, interpret=True)
    want = (k.astype(jnp.float32) + v.astype(jnp.float32)).reshape(2, 3, 2, 128, 16).sum(axis=3)
    want = want + seed[:, None, None, None]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="whole 64-key blocks"):
        prf.read_cache(seed, k, v, chunks=3, block_k=64, warps=4, stages=2, interpret=True)
    with pytest.raises(ValueError, match="CHUNKSxBLOCK_K"):
        prf.parse_config("32x64")
    assert prf.main(["--small", "--prefixes", "256", "--configs", "2x64w4s2,3x64w4s2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "read_floor.json").read_text())["rows"]
    assert [r["config"] for r in rows] == ["attention (default)", "2x64w4s2"]   # 3 x 64 keys do not cut 256
    assert all(r["wall_us"] > 0 and "error" not in r for r in rows)


def test_round_latency_plot_from_a_bench_round_json(tmp_path):
    from bench import plots

    stage = dict(draft=1.0, tree=0.5, verify=4.0, walk=0.2, commit=0.3)
    rows = [dict(method="ddtree", budget=64, round_ms_median=7.4, round_ms_steady=7.3, stage_ms=stage, prompt_len=512),
            dict(method="ar", budget=0, round_ms_median=4.5, round_ms_steady=4.4, stage_ms=dict(verify=4.3)),
            dict(method="dflash", budget=15, round_ms_median=6.4, round_ms_steady=6.3, stage_ms=stage)]
    src = tmp_path / "round_qwen3-8b_auto.json"
    src.write_text(json.dumps(dict(model="qwen3-8b", device="GPU", attn_impl="auto", rows=rows)))
    assert plots.main([str(src)]) == 0
    png = tmp_path / "round_latency.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = tmp_path / "x.json"
    bad.write_text("[1, 2]")
    assert plots.main([str(bad)]) == 2 and plots.main([str(png)]) == 2
    # the suite's bench.json with a round-latency part and no rows draws it alone
    out = tmp_path / "suite"
    out.mkdir()
    assert [p.name for p in plots.draw_all(dict(runs=[], round_latency=dict(model="m", rows=rows)), out)] == [
        "round_latency.png"]
    # rows with the verify alone and no stages (bench_round --verify-loop): verify + the rest
    verify_rows = [dict(r, stage_ms={}, verify_ms_steady=r["round_ms_steady"] - 1.0) for r in rows]
    src.write_text(json.dumps(dict(model="qwen3-8b", device="GPU", rows=verify_rows)))
    png.unlink()
    assert plots.main([str(src)]) == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_mgpu_prefix_plot_from_a_bench_mgpu_json(tmp_path):
    """bench_mgpu's mgpu.json (a list of rows) draws mgpu_prefix.png: a line per config, failed
    rows (no busy_us) left out, one panel per T."""
    from bench import plots

    rows = [dict(t=t, prefix=p, config=c, busy_us=10.0 + p / 100 + t / 50) for t in (72, 264)
            for p in (512, 4096) for c in ("triton", "64x4w2kc3")]
    rows.append(dict(t=264, prefix=8192, config="64x3w2sot8", error="RuntimeError: out of time"))
    src = tmp_path / "mgpu.json"
    src.write_text(json.dumps(rows))
    assert plots.is_mgpu_rows(rows) and not plots.is_mgpu_rows([1, 2]) and not plots.is_mgpu_rows([])
    assert plots.main([str(src)]) == 0
    assert (tmp_path / "mgpu_prefix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_round_tiny_smoke_writes_json_and_plot(tmp_path):
    from bench import bench_round

    assert bench_round.main(["--model", "tiny", "--prompt-len", "32", "--methods", "ar,ddtree", "--budgets", "4",
                             "--rounds", "2", "--repeats", "1", "--stage-repeats", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny_auto.json").read_text())
    assert [(r["method"], r["budget"]) for r in data["rows"]] == [("ar", 0), ("ddtree", 4)]
    assert all(r["round_ms_median"] > 0 for r in data["rows"])
    for r in data["rows"]:  # a call = its rounds at the steady rate + its fixed cost
        assert len(r["call_fixed_ms_all"]) == 1
        assert r["call_fixed_ms"] == pytest.approx((r["round_ms_median"] - r["round_ms_steady"]) * 2)
    assert (tmp_path / "round_latency.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_round_batch(tmp_path, capsys):
    from bench import bench_round

    assert bench_round.main(["--model", "tiny", "--prompt-len", "16", "--methods", "ddtree", "--budgets", "4",
                             "--batch", "3", "--rounds", "2", "--repeats", "1", "--stage-repeats", "1",
                             "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny_auto_b3.json").read_text())
    assert data["batch"] == 3 and data["rows"][0]["batch"] == 3 and data["rows"][0]["round_ms_median"] > 0
    with pytest.raises(SystemExit):
        bench_round.main(["--model", "tiny", "--batch", "0"])
    assert "--batch must be >= 1" in capsys.readouterr().err


def test_bench_round_stage_times_add_a_stages_calls(monkeypatch):
    """The verify stage is two calls (the forward, then choosing the target's tokens): per repeat
    they add up. (Up to session 4 both went into one list whose median mixed them.)"""
    import time

    from bench import bench_round
    from ddtree_jax import profile
    from ddtree_jax.generator import Generator

    real = profile.stage_functions

    def slowed(*a, **k):
        fns = dict(real(*a, **k))
        for name, secs in (("verify", 0.03), ("choose", 0.01)):
            fn = fns[name]
            fns[name] = lambda *x, fn=fn, secs=secs: (time.sleep(secs), fn(*x))[1]
        return fns

    monkeypatch.setattr(profile, "stage_functions", slowed)
    gen = Generator(bench_round.build("tiny", jnp.float32), method="ar")
    r = bench_round.measure(gen, 16, rounds=1, repeats=1, stage_repeats=2)
    assert r["stage_ms"]["verify"] >= 40.0
    assert r["prefill_ms"] > 0 and r["prefill_first_ms"] > 0


def test_bench_gemm_smoke_and_table(tmp_path):
    """bench_gemm in interpret mode writes its JSON; --write-table merges winners per device kind."""
    from bench import bench_gemm as bg

    table = tmp_path / "table.json"
    table.write_text(json.dumps({"other GPU": [{"k": 1, "n": 1, "rows": [1, 1], "config": [16, 16, 4, 1, 1],
                                                "us": 1.0, "xla_us": 2.0}]}))
    assert bg.main(["--small", "--rows", "1,16", "--variants", "xla,pallas", "--reps", "1", "--out", str(tmp_path),
                    "--write-table", str(table), "--min-gain", "-1000"]) == 0
    res = json.loads((tmp_path / "bench_gemm.json").read_text())
    assert {(r["shape"], r["m"], r["variant"]) for r in res["rows"]} == {
        (s, m, v) for s in bg.SMALL for m in (1, 16) for v in ("xla", "pallas")}
    assert (tmp_path / "gemm_bandwidth.png").read_bytes()[:4] == b"\x89PNG"
    written = json.loads(table.read_text())
    assert "other GPU" in written and len(written[res["device"]]) == 2 * len(bg.SMALL)


def test_bench_gemm_split_partials_variant(tmp_path):
    """split:PARTS: the product as float32 partials of one batched dot over K / PARTS columns
    each, whose sum is the product; products with a prologue or int8 weights are refused."""
    from bench import bench_gemm as bg

    x = jax.random.normal(jax.random.key(0), (5, 96), jnp.float32)
    w = jax.random.normal(jax.random.key(1), (96, 40), jnp.float32)
    for parts in (2, 3, 4):
        p = bg.split_parts(x, w, parts)
        assert p.shape == (parts, 5, 40) and p.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(p[1]), np.asarray(x[:, 96 // parts:2 * 96 // parts]
                                                                 @ w[96 // parts:2 * 96 // parts]), rtol=1e-5)
        np.testing.assert_allclose(np.asarray(p.sum(0)), np.asarray(x @ w), rtol=2e-5, atol=2e-5)
    with pytest.raises(ValueError, match="does not divide"):
        bg.split_parts(x, w, 5)
    assert bg.parse_variant("split:4:xla_gpu_experimental_force_split_k=1") == (
        "split", (4, {"xla_gpu_experimental_force_split_k": 1}))
    with pytest.raises(SystemExit, match="PARTS >= 2"):
        bg.parse_variant("split:1")
    assert bg.main(["--small", "--rows", "16", "--variants", "xla,split:2", "--reps", "1", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "bench_gemm.json").read_text())
    plain = {s for s in bg.SMALL if not bg.prologue_of(s) and not s.endswith("_int8")}
    assert {r["shape"] for r in res["rows"] if r["variant"] == "split:2"} == plain
    assert all("split:PARTS takes plain bf16 products only" in e for e in res["errors"])


def test_bench_gemm_table_rows(tmp_path):
    from bench import bench_gemm as bg

    def rows(shape, m, xla, ker):
        return [dict(shape=shape, k=64, n=32, m=m, variant="xla", wall_us=xla, config=None),
                dict(shape=shape, k=64, n=32, m=m, variant="pallas", wall_us=ker, config=[32, 64, 4, 4, 1])]

    measured = rows("a", 1, 10, 9) + rows("a", 16, 10, 5) + rows("a", 65, 10, 5) + rows("a", 32, 10, 9.9)
    got = {e["measured_m"]: e["rows"] for e in bg.table_entries(measured, 0.03)}
    # 32 gains 1 % only: no entry; 1 and 16 share the 16-row tile; 65 covers its tile's rows
    assert got == {1: [1, 1], 16: [2, 16], 65: [65, 128]}
    assert bg.bucket(17) == (17, 32) and bg.bucket(128) == (65, 128)

    # against XLA in an executable with an option: the entry carries it, and a table keeps the
    # plain entry of the same shape beside it
    f = "xla:xla_gpu_experimental_force_split_k=1"
    flagged = rows("a", 16, 10.0, 9.9) + [dict(shape="a", k=64, n=32, m=16, variant=f, wall_us=12.0, config=None)]
    assert bg.table_entries(flagged, 0.03) == []                  # 1 % against plain XLA
    (entry,) = bg.table_entries(flagged, 0.03, against=f)
    assert entry["xla_options"] == {"xla_gpu_experimental_force_split_k": 1} and entry["xla_us"] == 12.0
    with pytest.raises(SystemExit, match="--against"):
        bg.table_entries(flagged, 0.03, against="pallas")
    path = tmp_path / "t.json"
    plain = dict(entry, xla_options=None)
    del plain["xla_options"]
    bg.write_table(path, "GPU", [plain])
    bg.write_table(path, "GPU", [entry])
    assert len(json.loads(path.read_text())["GPU"]) == 2


def test_bench_round_a_failing_row_does_not_stop_the_others(tmp_path, monkeypatch):
    """A row that fails (a kernel that does not compile on the device, say) is recorded and the
    run goes on: device time is too scarce to lose a whole step to one row."""
    from bench import bench_round

    real = bench_round.measure

    def measure(gen, *a, **k):
        if gen.method == "ar":
            raise RuntimeError("no kernel for you")
        return real(gen, *a, **k)

    monkeypatch.setattr(bench_round, "measure", measure)
    assert bench_round.main(["--model", "tiny", "--prompt-len", "32", "--methods", "ar,dflash", "--rounds", "2",
                             "--repeats", "1", "--stage-repeats", "0", "--verify-loop", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny_auto.json").read_text())
    assert [r["method"] for r in data["rows"]] == ["dflash"]
    assert len(data["errors"]) == 1 and "no kernel for you" in data["errors"][0]
    # --verify-loop: the verify pass alone, in a device loop
    assert data["rows"][0]["verify_ms_steady"] is not None and len(data["rows"][0]["verify_ms_steady_all"]) == 1


def test_bench_round_stage_loop(tmp_path):
    """--stage-loop: every stage alone in a device loop, the breakdown the row reports (with a
    token map: the draft's head cut to 32 columns, the tree's indices mapped back)."""
    from bench import bench_round

    assert bench_round.main(["--model", "tiny", "--prompt-len", "24", "--methods", "ddtree", "--budgets", "4",
                             "--rounds", "2", "--repeats", "1", "--stage-loop", "--draft-vocab", "32",
                             "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "round_tiny_auto.json").read_text())["rows"]
    assert [(r["method"], sorted(r["stage_ms"]), r["stage_timing"], r["draft_vocab"]) for r in rows] == [
        ("ddtree", ["commit", "draft", "tree", "verify", "walk"], "device loop", 32)]
    for r in rows:
        assert r["verify_ms_steady"] == r["stage_ms"]["verify"]
        assert all(math.isfinite(v) for v in r["stage_ms"].values())


def test_stage_loop_tree_pass_keeps_the_ancestor_mask():
    """The stage loop's tree pass computes the whole tree: in a loop of it the ancestor mask's
    squaring matmuls (the CPU's construction) survive XLA's dead-code elimination, which they did
    not when the pass used one token of the tree."""
    import functools
    import types

    import jax

    from bench.bench_round import tree_pass
    from ddtree_jax import engine

    spec = engine.DecodeSpec(budget=16)
    state = types.SimpleNamespace(root=jnp.zeros((1,), jnp.int32))  # all tree_stage reads
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(0), (1, 15, 300)), -1)
    step = functools.partial(tree_pass, spec=spec)
    loop = jax.jit(lambda n, acc, lp: jax.lax.fori_loop(0, n, lambda _, a: step(a, lp, state), acc))
    hlo = loop.lower(3, jnp.float32(0), logp).compile().as_text()
    assert " dot(" in hlo


def test_xla_options_are_typed():
    from bench.bench_round import xla_options

    assert xla_options(None) is None
    assert xla_options(["xla_gpu_exhaustive_tiling_search=true", "xla_gpu_enable_command_buffer=",
                        "xla_gpu_autotune_level=4", "xla_dump_to=/tmp/x"]) == {
        "xla_gpu_exhaustive_tiling_search": True, "xla_gpu_enable_command_buffer": "",
        "xla_gpu_autotune_level": 4, "xla_dump_to": "/tmp/x"}


def test_attn_configs_specs_trees_and_smoke(tmp_path, capsys):
    """bench.attn_configs: its config specs, its two tree kinds (ancestor-or-self masks in
    topological order) and a CPU run in interpret mode that writes its JSON."""
    from bench import attn_configs as ac

    cfg = ac.parse_config("64x32w4s3n1b64k1", 257, 4, 64, 512, None)
    assert (cfg.block_m, cfg.block_k, cfg.num_warps, cfg.num_stages, cfg.num_splits, cfg.block_new,
            cfg.skip_empty) == (64, 32, 4, 3, 1, 64, True)
    assert ac.parse_config("64x32w4s3", 257, 4, 64, 512, None).skip_empty is None
    assert ac.parse_config("64x32w4s3k0", 257, 4, 64, 512, None).skip_empty is False
    with pytest.raises(ValueError, match="BMxBKwWARPSsSTAGES"):
        ac.parse_config("64x32", 257, 4, 64, 512, None)
    assert ac.parse_configs("257=table,64x64w4s3;65=table") == {257: ["table", "64x64w4s3"], 65: ["table"]}
    with pytest.raises(ValueError, match="T=SPEC"):
        ac.parse_configs("x=table")
    for kind in ("ddtree", "random"):
        m = ac.tree_masks(kind, 33, 2, seed=0, sigma=3.0)
        assert m.shape == (2, 33, 33) and m[:, :, 0].all() and (np.diagonal(m, axis1=1, axis2=2)).all()
        assert not np.triu(m, 1).any()          # ancestors come first
    assert ac.main(["--small", "--ts", "17", "--prefix", "24", "--heads", "4,2,64", "--trees", "ddtree",
                    "--configs", "17=table,16x16w4s2n1b16k1", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "attn_configs.json").read_text())["rows"]
    assert [r["config"] for r in rows] == ["table", "16x16w4s2n1b16k1"] and all(r["err"] < 1e-5 for r in rows)


def test_pick_mgpu_takes_the_fastest_exact_config_per_t():
    from bench.pick_mgpu import pick
    rows = [dict(t=72, config="triton", busy_us=1.0, rel_err=0.0, nan=False),            # not a Mosaic config
            dict(t=72, config="64x3w1", busy_us=11.7, rel_err=3e-3, nan=False),
            dict(t=72, config="64x4w2k", busy_us=9.8, rel_err=3e-3, nan=False),
            dict(t=72, config="64x2w2k", busy_us=5.0, rel_err=0.5, nan=False),          # wrong: not picked
            dict(t=264, config="64x3w2", busy_us=18.9, rel_err=2e-3, nan=True),         # NaN: not picked
            dict(t=264, config="128x2w1", error="ValueError: ..."),
            dict(t=264, config="64x3w1", busy_us=26.1, rel_err=2e-3, nan=False)]
    assert pick(rows) == "72:64x4w2k,264:64x3w1"
    assert pick([]) == ""


def test_draft_vocab_bench_smoke(tmp_path):
    """bench.draft_vocab on a small corpus: maps from the train split, acceptance per map size on
    the eval prompts, the tokens checked equal to the full vocabulary's."""
    from bench import draft_vocab

    code = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"split": s, "text": code * (3 + i)})
                                for i, s in enumerate(["train"] * 4 + ["eval"] * 2)) + "\n")
    assert draft_vocab.main(["--data", str(corpus), "--sizes", "40", "--budgets", "4", "--prompts", "2",
                             "--prompt-tokens", "24", "--max-new-tokens", "6", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "draft_vocab.json").read_text())["rows"]
    assert [(r["budget"], r["size"], r["tokens_equal"]) for r in rows] == [(4, 40, True), (4, 8192, True)]
    assert rows[1]["eval_coverage"] == 1.0 and 0 < rows[0]["eval_coverage"] <= 1.0


def test_host_in_gaps_sums_host_events_inside_device_idle(tmp_path):
    """host_in_gaps: host events that start inside a device gap over 50 us, their overlap summed
    by thread and name; none outside a gap."""
    import glob

    f = jax.jit(lambda x: x * 2 + 1)
    f(jnp.ones(8)).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        for _ in range(3):
            f(jnp.ones(8)).block_until_ready()
    (path,) = glob.glob(f"{tmp_path}/**/*.xplane.pb", recursive=True)
    data = jax.profiler.ProfileData.from_file(path)
    spans = [(e.start_ns, e.start_ns + e.duration_ns) for p in data.planes if p.name == "/host:CPU"
             for line in p.lines for e in line.events]
    lo, hi = min(a for a, _ in spans), max(b for _, b in spans)
    whole = pr.host_in_gaps(path, [dict(start=lo - 1, dur=0), dict(start=hi + 1, dur=0)], rounds=1, top=1000)
    assert whole and all(h["ms_per_round"] > 0 for h in whole)
    assert sum(h["ms_per_round"] for h in whole) >= (hi - lo) / 1e6 * 0.5  # the busiest thread at least
    # one device "kernel" covering everything: no gap, nothing reported
    assert pr.host_in_gaps(path, [dict(start=lo - 1, dur=hi - lo + 2)], rounds=1) == []
    # a 40 us gap is below the threshold
    assert pr.host_in_gaps(path, [dict(start=lo, dur=0), dict(start=lo + 40_000, dur=hi - lo)], rounds=1) == []


def test_profile_mgpu_summary_of_an_in_kernel_trace():
    """bench.profile_mgpu reads Mosaic GPU's profiler trace: tracks per warpgroup, SM as pid, ts =
    the CTA's global-timer start (ns) plus cycles since its first event, over 1e3."""
    from bench.profile_mgpu import format_summary, summarize_trace

    def track(tid, sm, start_ns, ranges):
        evs = []
        for name, a, b in ranges:
            evs.append(dict(name=name, ph="B", ts=(start_ns + a) / 1e3, pid=sm + 1, tid=tid))
            evs.append(dict(name=name, ph="E", ts=(start_ns + b) / 1e3, pid=sm + 1, tid=tid))
        return evs

    # Two CTAs of (2 compute warpgroups + 1 memory warpgroup); CTA 1 starts 500 ns later on
    # SM 7, CTA 0 runs on SM 3.
    ev = []
    ev += track(1, 3, 1000, [("q", 0, 100), ("qk", 100, 300), ("softmax", 300, 600), ("qk", 600, 800)])
    ev += track(2, 3, 1000, [("q", 0, 50), ("qk", 50, 250), ("softmax", 250, 400), ("pv", 400, 1000)])
    ev += track(3, 3, 1000, [("loads", 0, 900)])
    ev += track(4, 7, 1500, [("q", 0, 100), ("qk", 100, 1800)])
    ev += track(5, 7, 1500, [("q", 0, 100), ("qk", 100, 200)])
    ev += track(6, 7, 1500, [("loads", 0, 400), ("drain", 400, 500)])
    s = summarize_trace({"traceEvents": ev}, warpgroups=3, compute_wgs=2, clock_ghz=2.0)
    assert (s["ctas"], s["sms"], s["max_ctas_per_sm"]) == (2, 2, 1)
    assert s["start_spread_us"] == pytest.approx(0.5)
    assert s["cta_cycles_max"] == pytest.approx(1800)
    assert s["cta_cycles_mean"] == pytest.approx((1000 + 1800) / 2)
    assert s["span_us"] == pytest.approx(0.5 + 1800 / 2000)   # CTA 1 ends last
    c = s["compute"]
    assert c["tracks"] == 4
    assert c["cycles"] == pytest.approx((800 + 1000 + 1800 + 200) / 4)
    assert c["scopes"]["qk"]["cycles"] == pytest.approx((400 + 200 + 1700 + 100) / 4)
    assert c["scopes"]["qk"]["count"] == pytest.approx(5 / 4)
    assert c["scopes"]["qk"]["each"] == pytest.approx(2400 / 5)
    assert c["outside_scopes"] == pytest.approx(0)
    assert list(c["scopes"])[0] == "qk"                            # the largest first
    m = s["memory"]
    assert m["scopes"]["drain"]["count"] == pytest.approx(0.5)
    assert m["cycles"] == pytest.approx((900 + 500) / 2)
    assert "2 CTAs on 2 SMs" in format_summary("x", s)


def test_profile_ranges_cover_every_step():
    from ddtree_jax.kernels.tree_attention_mgpu import MgpuConfig, profile_ranges
    assert profile_ranges(264, 1024, MgpuConfig()) == 5 * (16 + 5) + 8
    assert profile_ranges(264, 1024, MgpuConfig(block_k=128)) == 5 * (8 + 3) + 8


def test_profile_mgpu_unwraps_the_global_timer():
    """CTA starts are the global timer's low 32 bits: a wrap inside the kernel is undone."""
    from bench.profile_mgpu import summarize_trace
    ev = []
    for tid, start in ((1, 2**32 - 100), (2, 2**32 - 100), (3, 50), (4, 50)):
        for ph, cyc in (("B", 0), ("E", 10)):
            ev.append(dict(name="qk", ph=ph, ts=(start + cyc) / 1e3, pid=tid, tid=tid))
    s = summarize_trace({"traceEvents": ev}, warpgroups=2, compute_wgs=1, clock_ghz=1.0)
    assert s["ctas"] == 2
    assert s["start_spread_us"] == pytest.approx(0.15)


def test_call_phases_reads_a_call_off_the_command_buffer_log(tmp_path, capsys):
    """call_phases lines a call's start and end (probe_call_fixed --log-calls) up with XLA's
    command-buffer log: launches before the call (the prefill's) do not count; the phases are
    start to first launch, launch to launch, last launch to end; updates inside are counted."""
    from bench import call_phases

    log = tmp_path / "probe.log"
    log.write_text("\n".join([
        "I1204 09:59:59.990000     465 command_buffer_thunk.cc:371] [0] Execute command buffer; num_executions=1",
        "[probe_call_fixed] call state 2 rounds from 10:00:00.000000 to 10:00:00.020000 (20.000 ms)",
        "I1204 10:00:00.001000     465 command_buffer_thunk.cc:330] Update command buffer on device #0 by recoding",
        "I1204 10:00:00.003000     465 command_buffer_thunk.cc:371] [0] Execute command buffer; num_executions=1",
        "I1204 10:00:00.010000     465 command_buffer_thunk.cc:371] [0] Execute command buffer; num_executions=2",
        "W1204 10:00:00.011000     465 other.cc:1] unrelated",
        "[probe_call_fixed] call state 2 rounds from 10:00:01.000000 to 10:00:01.016000 (16.000 ms)",
        "I1204 10:00:01.002000     465 command_buffer_thunk.cc:371] [0] Execute command buffer; num_executions=3",
        "I1204 10:00:01.008000     465 command_buffer_thunk.cc:371] [0] Execute command buffer; num_executions=4",
    ]))
    out = tmp_path / "phases.json"
    assert call_phases.main([str(log), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["calls"]
    assert [r["launches"] for r in rows] == [2, 2] and [r["updates"] for r in rows] == [1, 0]
    assert rows[0]["to_first_launch_ms"] == pytest.approx(3.0) and rows[0]["after_last_launch_ms"] == pytest.approx(10.0)
    assert rows[1]["launch_to_launch_ms"] == pytest.approx(6.0)
    summ = json.loads(out.read_text())["summary"]["state 2"]
    assert summ["calls"] == 2 and summ["to_first_launch_ms"] == pytest.approx(2.5)
    assert "state 2" in capsys.readouterr().out
    empty = tmp_path / "empty.log"
    empty.write_text("nothing\n")
    with pytest.raises(SystemExit):
        call_phases.main([str(empty)])


def test_bench_kernels_table_times_what_the_engine_runs(tmp_path, monkeypatch):
    """bench_kernels' engine column: attention(impl="auto") at verify_rows' rows, the padding rows
    seeing only themselves as engine.pad_verify_rows makes them (verify_rows forced to pad to 8
    here: on the CPU it never pads), over the cache generate would give the request (the prefix
    committed), the floors' percentages from its time."""
    from ddtree_jax.engine import pad_verify_rows
    from ddtree_jax.generator import cache_positions

    monkeypatch.setattr(bk, "verify_rows", lambda t, *a, **k: -(-t // 8) * 8)
    timed = []
    real = bk.time_chain

    def spy(fn, args, **kw):
        timed.append(args)
        return real(fn, args, **kw)

    monkeypatch.setattr(bk, "time_chain", spy)
    monkeypatch.setattr(sys, "argv", ["bench_kernels", "--small", "--no-sweep", "--no-correctness",
                                      "--no-xla", "--prefixes", "64", "--out", str(tmp_path)])
    bk.main()
    table = json.loads((tmp_path / "bench_kernels.json").read_text())["table"]
    assert [(r["t"], r["engine_rows"], r["engine_impl"]) for r in table] == [(1, 8, "xla"), (9, 16, "xla")]
    for r in table:
        assert r["engine_us"] > 0 and r["pct_of_bytes_floor_engine"] > 0 and r["pct_of_roofline_engine"] > 0
    for t, tp in [(1, 8), (9, 16)]:
        [plain] = [a for a in timed if a[0].shape[1] == t]
        [padded] = [a for a in timed if a[0].shape[1] == tp]
        _, _, want = pad_verify_rows(jnp.zeros((1, t), jnp.int32), jnp.zeros((1, t), jnp.int32), plain[6], tp)
        assert np.array_equal(np.asarray(padded[6]), np.asarray(want))
        positions = cache_positions(64, 512, t - 1, bk.DRAFT_DEPTH if t > 1 else 0)[0]
        assert positions > 64 and padded[3].shape[2] == positions and plain[3].shape[2] == 64
        assert np.asarray(padded[5]).tolist() == [64]
    assert [r["engine_cache"] for r in table] == [cache_positions(64, 512, t - 1, bk.DRAFT_DEPTH if t > 1 else 0)[0]
                                                  for t in (1, 9)]
