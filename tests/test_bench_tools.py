"""The GPU measurement scripts in their CPU smoke modes, and the profile parser's pieces."""
from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import pytest

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


def test_profile_parts_are_the_target_layer_scopes():
    """A kernel's part is its scope's attn / gdn / moe / mlp segment; an untagged one between two
    kernels of one part takes it, as stages do."""
    assert pr.stage_of("jit(r)/while/body/verify/layer3/gdn/dot_general", pr.PARTS) == "gdn"
    assert pr.stage_of("jit(r)/while/body/verify/layer3/add", pr.PARTS) == "other"
    scopes = {"f_1": "jit(f)/while/body/verify/layer0/moe/add", "f_2": "jit(f)/while/body/verify/layer1/gdn/mul"}
    events = [dict(name=n, start=t, dur=1000, hlo_op=op) for n, t, op in (
        ("f_1", 0, "f_1"), ("nvjet_1", 2000, ""), ("f_1", 4000, "f_1"), ("nvjet_2", 6000, ""), ("f_2", 8000, "f_2"))]
    s = pr.summarize(events, scopes, rounds=1)
    assert s["parts_ms"] == {"verify:moe": 0.003, "verify:gdn": 0.001, "verify:other": 0.001}
    assert s["parts_kernels"]["verify:moe"] == 3


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

    from bench.bench_round import SHAPES
    from ddtree_jax.checkpoint import DEFAULT_CKPT

    t = json.loads((DEFAULT_CKPT / "target" / "config.json").read_text())  # the HF configs it was converted from
    d = json.loads((DEFAULT_CKPT / "draft" / "config.json").read_text())
    s = SHAPES["shipped"]
    assert s["target"] == dict(vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
                               intermediate_size=t["intermediate_size"], num_layers=t["num_hidden_layers"],
                               num_heads=t["num_attention_heads"], num_kv_heads=t["num_key_value_heads"],
                               head_dim=t["head_dim"], max_position=t["max_position_embeddings"],
                               tie_embeddings=t["tie_word_embeddings"])
    assert s["drafter"] == dict(num_layers=d["num_hidden_layers"], block_size=d["block_size"],
                                target_layer_ids=tuple(d["dflash_config"]["target_layer_ids"]))
    assert s["theta"] == t["rope_theta"]


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


def test_bench_round_tiny_smoke_writes_json_and_plot(tmp_path):
    from bench import bench_round

    assert bench_round.main(["--model", "tiny", "--prompt-len", "32", "--methods", "ar,ddtree", "--budgets", "4",
                             "--rounds", "2", "--repeats", "1", "--stage-repeats", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny_auto.json").read_text())
    assert [(r["method"], r["budget"]) for r in data["rows"]] == [("ar", 0), ("ddtree", 4)]
    assert all(r["round_ms_median"] > 0 for r in data["rows"])
    assert not any("bytes_floor_ms" in r or "moe_distinct_experts_mean" in r for r in data["rows"])  # dense
    for r in data["rows"]:  # a call = its rounds at the steady rate + its fixed cost
        assert len(r["call_fixed_ms_all"]) == 1
        assert r["call_fixed_ms"] == pytest.approx((r["round_ms_median"] - r["round_ms_steady"]) * 2)
    assert (tmp_path / "round_latency.png").read_bytes()[:4] == b"\x89PNG"


def test_bench_round_times_the_deterministic_mode_beside_the_default(tmp_path):
    from bench import bench_round

    assert bench_round.main(["--model", "tiny", "--prompt-len", "16", "--methods", "ar", "--deterministic", "off,on",
                             "--rounds", "2", "--repeats", "1", "--stage-repeats", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny_auto.json").read_text())
    assert [r["deterministic"] for r in data["rows"]] == [False, True]
    assert all(r["round_ms_median"] > 0 for r in data["rows"])
    with pytest.raises(SystemExit):
        bench_round.main(["--model", "tiny", "--deterministic", "maybe"])


def test_bench_round_times_each_moe_experts_impl(tmp_path):
    """--moe-experts: one row an impl (the grouped Pallas product interpreted here), each recorded."""
    from bench import bench_round

    assert bench_round.main(["--model", "tiny-moe", "--prompt-len", "16", "--methods", "ar", "--moe-experts",
                             "dense,grouped", "--matmul-impl", "pallas_interpret", "--rounds", "2", "--repeats", "1",
                             "--stage-repeats", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny-moe_auto.json").read_text())
    assert "errors" not in data
    assert [r["moe_experts"] for r in data["rows"]] == ["dense", "grouped"]
    assert all(r["round_ms_median"] > 0 for r in data["rows"])
    with pytest.raises(SystemExit):
        bench_round.main(["--model", "tiny-moe", "--moe-experts", "sparse"])


@pytest.mark.parametrize("methods", ["ar,dflash", "ddtree"])  # two tests of a few compiles each
def test_bench_round_moe_rows_report_the_experts_a_round_reads(tmp_path, capsys, methods):
    """An MoE shape's rows: the distinct experts per layer the round's verify reads (AR at batch 1:
    its token's top-k exactly) and the round's bytes floor from them."""
    from bench import bench_round

    assert bench_round.main(["--model", "tiny-moe", "--prompt-len", "16", "--methods", methods, "--budgets", "4",
                             "--rounds", "2", "--repeats", "1", "--stage-repeats", "0", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "round_tiny-moe_auto.json").read_text())
    moe = bench_round.SHAPES["tiny-moe"]["moe"]
    t = bench_round.SHAPES["tiny-moe"]["target"]
    assert data["signature"]["experts"] == moe["num_experts"] and data["signature"]["top_k"] == moe["top_k"]
    rows = {r["method"]: r for r in data["rows"]}
    assert list(rows) == methods.split(",")
    expert = 3 * t["hidden_size"] * moe["expert_intermediate"] * 2  # bf16
    embed = t["vocab_size"] * t["hidden_size"] * 2
    for r in rows.values():
        per_layer = r["moe_distinct_experts"]
        assert len(per_layer) == t["num_layers"], r
        assert moe["top_k"] <= r["moe_distinct_experts_mean"] <= r["moe_distinct_experts_max"] <= moe["num_experts"]
        assert r["moe_distinct_experts_mean"] == pytest.approx(sum(per_layer) / len(per_layer))
        b = r["bytes_floor"]
        assert b["one_expert"] == expert and b["experts"] == sum(per_layer) * expert
        # dense = every target weight but the experts' and the embedding's
        assert b["dense_target"] == data["target_bytes"] - t["num_layers"] * moe["num_experts"] * expert - embed
        assert (b["drafter"] > 0) == (r["method"] != "ar")
        total = b["dense_target"] + b["drafter"] + b["experts"]
        assert r["bytes_floor_ms"] == pytest.approx(1e3 * total / bench_round.HBM_BYTES_PER_S) and r["bytes_floor_ms"] > 0
        assert r["floor_ratio"] == pytest.approx(r["round_ms_steady"] / r["bytes_floor_ms"])
    if "ar" in rows:
        assert rows["ar"]["moe_verify_tokens"] == 1
        assert rows["ar"]["moe_distinct_experts"] == [moe["top_k"]] * t["num_layers"]
    if "dflash" in rows:
        assert rows["dflash"]["moe_verify_tokens"] == bench_round.SHAPES["tiny-moe"]["drafter"]["block_size"]
    if "ddtree" in rows:
        assert rows["ddtree"]["moe_verify_tokens"] == 5  # root + 4 nodes, no padding rows
    assert "bytes floor" in capsys.readouterr().out


def test_bench_round_moe_shapes_hold_the_weights_once():
    """build's MoE target comes in the inference layout (experts' gate/up drawn fused, q/k/v fused),
    so a Generator's fuse_params shares every weight array instead of copying; the 30B-A3B entry
    is Qwen3-30B-A3B's shape with taps as z-lab's rule spreads them."""
    from bench.bench_round import SHAPES, build
    from ddtree_jax.generator import Generator
    from ddtree_jax.models.config import default_target_layer_ids

    ck = build("tiny-moe", jnp.bfloat16)
    assert ck.target_cfg.moe is not None and all(ck.target_cfg.moe.sparse_layers)
    for layer in ck.target_params["layers"]:
        assert {"qkv", "experts_gate_up", "experts_down", "router"} <= set(layer)
        assert not {"q", "k", "v", "experts_gate", "experts_up"} & set(layer)
    gen = Generator(ck, method="ar")
    for mine, theirs in zip(ck.target_params["layers"], gen.tparams["layers"]):
        assert all(theirs[k] is mine[k] for k in ("qkv", "o", "experts_gate_up", "experts_down", "router"))

    s = SHAPES["qwen3-30b-a3b"]
    t, d, moe = s["target"], s["drafter"], s["moe"]
    assert d["target_layer_ids"] == tuple(default_target_layer_ids(t["num_layers"], d["num_layers"]))
    assert (moe["num_experts"], moe["top_k"], moe["expert_intermediate"]) == (128, 8, 768)
    experts = t["num_layers"] * moe["num_experts"] * 3 * t["hidden_size"] * moe["expert_intermediate"] * 2
    assert 57e9 < experts < 59e9  # the 61 GB target is mostly experts


def test_bench_round_qwen3_32b_shape():
    """The qwen3-32b entry (bench round --tp's shape): Qwen3-32B's 32.8 B parameters, taps as
    z-lab's rule spreads them, and every dimension --tp cuts divisible by 2 and 4 devices."""
    from bench.bench_round import SHAPES
    from ddtree_jax.models.config import default_target_layer_ids

    t, d = SHAPES["qwen3-32b"]["target"], SHAPES["qwen3-32b"]["drafter"]
    h, heads, kv, dh, inter = t["hidden_size"], t["num_heads"], t["num_kv_heads"], t["head_dim"], t["intermediate_size"]
    assert d["target_layer_ids"] == tuple(default_target_layer_ids(t["num_layers"], d["num_layers"]))
    layer = h * (heads + 2 * kv) * dh + heads * dh * h + 3 * h * inter
    assert 32.7e9 < t["num_layers"] * layer + 2 * t["vocab_size"] * h < 32.9e9
    assert all(n % tp == 0 for n in (heads, kv, inter, t["vocab_size"]) for tp in (2, 4))


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


def test_bench_round_times_budget_auto(tmp_path, capsys):
    """--budgets auto times generate's --budget auto (no cost model for the CPU: its fixed
    fallback, with the warning generate gives); the row says auto, not the tree it built."""
    from bench import bench_round
    from ddtree_jax.generator import AUTO_FALLBACK

    with pytest.warns(UserWarning, match="--budget auto: no shipped cost model for cpu"):
        assert bench_round.main(["--model", "tiny", "--prompt-len", "16", "--methods", "ddtree", "--budgets", "auto",
                                 "--auto-budgets", "4,8", "--rounds", "2", "--repeats", "1", "--stage-repeats", "0",
                                 "--out", str(tmp_path)]) == 0
    row, = json.loads((tmp_path / "round_tiny_auto.json").read_text())["rows"]
    assert row["budget"] == "auto" and row["nodes"] == AUTO_FALLBACK and row["round_ms_median"] > 0
    assert "B= auto" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        bench_round.main(["--model", "tiny", "--budgets", "auto", "--auto-budgets", "x"])
    err = capsys.readouterr()
    assert "'x' is not a DDTree budget >= 1" in err.err and "weights ready" not in err.out


def test_bench_round_stage_times_add_a_stages_calls(monkeypatch):
    """The synced breakdown (profile.profiled_rounds): the verify stage is two calls (the forward,
    then choosing the target's tokens), which add up in a round, not one list whose median mixes them."""
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
