"""The kernel benchmarks and device checks in their CPU smoke modes."""
from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from bench import bench_kernels as bk


def _args(s):
    q = jnp.ones((1, 2, 4, 8), jnp.float32)
    kv = jnp.ones((1, 2, s, 8), jnp.float32)
    return (q, q[:, :, :2], q[:, :, :2], kv, kv, jnp.array([s], jnp.int32), jnp.ones((1, 2, 2), bool))


def test_check_gpu_smoke(capsys):
    """bench.check_gpu's comparison runs end to end (Pallas in interpret mode vs XLA) and passes."""
    from bench.check_gpu import main

    assert main(["--impl", "pallas_interpret", "--layers", "1", "--small"]) == 0
    out = capsys.readouterr().out
    assert "T=   5 prefix=   21" in out and "T=  16 prefix=   21" in out and "(ok, tol" in out


def test_check_gpu_smoke_mosaic_interpret(capsys):
    """The Mosaic GPU kernel (interpret mode) inside target.forward, fed by the model's own cache
    and tree mask, against XLA; the T it cannot take (not a multiple of 8) are skipped by name.

    T = 16 runs its default config (8 key-split CTAs and the merge kernel). The interpreter runs
    each warpgroup as a nested CPU computation, which deadlocks inside the forward on 2 cores
    unless the process calls prepare_cpu_for_interpret first (conftest and check_gpu do)."""
    from bench.check_gpu import main

    assert main(["--impl", "mosaic_interpret", "--layers", "1", "--small"]) == 0
    out = capsys.readouterr().out
    assert "T=   5 prefix=   21 skipped" in out and "T=  16 prefix=   21 mosaic_interpret vs xla" in out
    assert "(ok, tol" in out


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


def test_bench_mgpu_picks_the_fastest_exact_config_per_t(tmp_path, capsys):
    """bench_mgpu's pick: per T the fastest Mosaic GPU config by busy_us among the exact ones (no
    NaN, rel_err < 2e-2); --pick prints it for an earlier run's mgpu.json."""
    from bench.bench_mgpu import fastest, main
    rows = [dict(t=72, config="triton", busy_us=1.0, rel_err=0.0, nan=False),            # not a Mosaic config
            dict(t=72, config="64x3w1", busy_us=11.7, rel_err=3e-3, nan=False),
            dict(t=72, config="64x4w2k", busy_us=9.8, rel_err=3e-3, nan=False),
            dict(t=72, config="64x2w2k", busy_us=5.0, rel_err=0.5, nan=False),          # wrong: not picked
            dict(t=264, config="64x3w2", busy_us=18.9, rel_err=2e-3, nan=True),         # NaN: not picked
            dict(t=264, config="128x2w1", error="ValueError: ..."),
            dict(t=264, config="64x3w1", busy_us=26.1, rel_err=2e-3, nan=False)]
    assert fastest(rows) == {72: "64x4w2k", 264: "64x3w1"}
    assert fastest([]) == {}
    src = tmp_path / "mgpu.json"
    src.write_text(json.dumps(rows))
    assert main(["--pick", str(src)]) == 0
    assert json.loads(capsys.readouterr().out) == {"72": "64x4w2k", "264": "64x3w1"}


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


def test_bench_kernels_table_times_what_the_engine_runs(tmp_path, monkeypatch):
    """bench_kernels' engine column: attention(impl="auto") at verify_rows' rows, the padding rows
    seeing only themselves as engine.pad_verify_rows makes them (verify_rows forced to pad to 8
    here: on the CPU it never pads), over the cache generate would give the request (the prefix
    committed), the floors' percentages from its time."""
    from ddtree_jax.engine import pad_verify_rows
    from ddtree_jax.generator import cache_positions

    monkeypatch.setattr(bk, "verify_rows", lambda kernels, t, *a, **k: -(-t // 8) * 8)
    timed = []
    real = bk.time_chain

    def spy(fn, args, **kw):
        timed.append(args)
        return real(fn, args, **kw)

    monkeypatch.setattr(bk, "time_chain", spy)
    assert bk.main(["--small", "--no-sweep", "--no-correctness", "--no-xla", "--prefixes", "64",
                    "--out", str(tmp_path)]) == 0
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


def test_bench_gemm_model_shapes():
    """--model picks whose shapes --shapes names: the 30B-A3B's dense products (its experts run grouped)."""
    from bench import bench_gemm as bg

    assert bg.SHAPE_SETS["qwen3-30b-a3b"]["qkv_norm"] == (2048, 32 * 128 + 2 * 4 * 128)
    assert bg.SHAPE_SETS["qwen3-30b-a3b"]["o"] == (32 * 128, 2048)
    for model, shapes in bg.DEFAULT_SHAPES.items():   # the defaults are the model's own
        assert set(shapes.split(",")) <= set(bg.SHAPE_SETS[model])
    with pytest.raises(SystemExit, match="unknown qwen3-30b-a3b shape 'gate_up'"):
        bg.main(["--model", "qwen3-30b-a3b", "--shapes", "gate_up"])
    # the 27B's: the hybrid inference layout's products at bench round's Qwen3.5-27B config
    pytest.importorskip("transformers.models.qwen3_5")
    from bench.bench_round import hf_config
    from ddtree_jax.models.hybrid import HybridConfig

    c = HybridConfig.from_hf(hf_config("qwen3.5-27b"))
    g, h, qd, kvd = c.gdn, c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    assert bg.SHAPE_SETS["qwen3.5-27b"] == {
        "in_proj": (h, g.conv_dim + g.value_dim + 2 * g.num_v_heads), "gdn_out": (g.value_dim, h),
        "qgkv": (h, 2 * qd + 2 * kvd), "o": (qd, h), "gate_up": (h, 2 * c.intermediate_size),
        "down_swiglu": (c.intermediate_size, h), "lm_head": (h, c.vocab_size)}
