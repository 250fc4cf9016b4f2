"""`python -m bench checkpoint` in its CPU smoke mode (--model tiny), and its parser of generate's stats line."""
from __future__ import annotations

import json
import types

from bench import checkpoint


def test_checkpoint_tiny_measures_every_command_and_cleans_up(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    assert checkpoint.main(["--model", "tiny", "--work", str(work), "--out", str(out), "--shard-gb", "0.001",
                            "--max-new-tokens", "4"]) == 0
    doc = json.loads((out / "checkpoint_tiny.json").read_text())
    assert doc["create"]["target"]["shards"] >= 2  # sharded, with an index, as the hub has them
    assert doc["bytes"]["converted"] > 0 and doc["disk"]["copy_bytes_per_s"] > 0
    cmds = doc["commands"]
    assert list(cmds) == ["convert", "generate_cold", "generate_warm", "generate_hf"]
    for name, c in cmds.items():
        assert c["rc"] == 0 and c["peak_rss_mb"] > 0 and c["wall_s"] > 0, (name, c)
        assert (out / c["log"]).is_file()
    for name in ("generate_cold", "generate_warm", "generate_hf"):
        c = cmds[name]
        assert c["first_token_s"] > 0 and c["load_s"] is not None and c["compile_s"] is not None, (name, c)
        assert c["device_peak_gib"] is None  # the CPU backend reports no memory stats
    assert {"convert_peak_rss", "convert_time", "generate_warm_peak_rss", "warm_first_token"} <= set(doc["targets"])
    assert not work.exists()  # HF dirs, converted checkpoint and compile cache deleted without --keep
    assert "warm_first_token" in (out / "checkpoint_tiny.md").read_text()


def test_checkpoint_tiny_moe_writes_the_hubs_layout_and_converts_and_generates(tmp_path):
    """A Qwen3-MoE target as the hub has it (per-expert tensors, the router as mlp.gate): convert
    and the three generate commands all run on it, the converted copy in --ckpt-dir."""
    work, out, elsewhere = tmp_path / "work", tmp_path / "out", tmp_path / "other-disk"
    elsewhere.mkdir()
    assert checkpoint.main(["--model", "tiny-moe", "--work", str(work), "--out", str(out), "--shard-gb", "0.001",
                            "--max-new-tokens", "4", "--keep", "--ckpt-dir", str(elsewhere / "c")]) == 0
    doc = json.loads((out / "checkpoint_tiny-moe.json").read_text())
    assert list(doc["commands"]) == ["convert", "generate_cold", "generate_warm", "generate_hf"]
    assert all(c["rc"] == 0 for c in doc["commands"].values()), doc["commands"]
    assert str(elsewhere / "c") in doc["commands"]["generate_warm"]["argv"] and (elsewhere / "c").is_dir()
    assert not (work / "ckpt-tiny-moe").exists() and sorted(p.name for p in elsewhere.iterdir()) == ["c"]
    assert doc["shape"]["moe"]["num_experts"] == 8 and not doc["skip_convert"]
    hf = work / "hf-tiny-moe-target"
    config = json.loads((hf / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"] and config["num_experts_per_tok"] == 2
    assert (config["decoder_sparse_step"], config["mlp_only_layers"], config["norm_topk_prob"]) == (1, [], True)
    names = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.1.mlp.gate.weight" in names
    assert {f"model.layers.1.mlp.experts.7.{p}_proj.weight" for p in ("gate", "up", "down")} <= set(names)
    assert not any("gate_up" in n or "mlp.gate_proj" in n for n in names)


def test_checkpoint_skip_convert_runs_generate_on_the_hf_directories_alone(tmp_path):
    """--skip-convert (a disk too small for a converted copy): no convert, no --ckpt runs, and the
    disk reference copies one shard, not the target."""
    work, out = tmp_path / "work", tmp_path / "out"
    assert checkpoint.main(["--model", "tiny-moe", "--work", str(work), "--out", str(out), "--shard-gb", "0.001",
                            "--max-new-tokens", "4", "--skip-convert"]) == 0
    doc = json.loads((out / "checkpoint_tiny-moe.json").read_text())
    assert doc["skip_convert"] and list(doc["commands"]) == ["generate_hf"]
    c = doc["commands"]["generate_hf"]
    assert c["rc"] == 0 and c["first_token_s"] > 0 and "--target" in c["argv"]
    assert doc["create"]["target"]["shards"] >= 2 and 0 < doc["disk"]["bytes"] < doc["bytes"]["target"]
    assert doc["bytes"]["converted"] is None and set(doc["targets"]) == {"generate_hf_peak_rss"}
    assert not work.exists()


def test_checkpoint_zeros_convert_alone_writes_sparse_files(tmp_path):
    """--zeros --skip-generate: HF files of holes (zeros) that convert reads like any other, convert
    measured alone, its time not judged against a disk that held no data."""
    work, out = tmp_path / "work", tmp_path / "out"
    assert checkpoint.main(["--model", "tiny-moe", "--work", str(work), "--out", str(out), "--shard-gb", "0.001",
                            "--zeros", "--skip-generate", "--keep"]) == 0
    doc = json.loads((out / "checkpoint_tiny-moe.json").read_text())
    assert list(doc["commands"]) == ["convert"] and doc["commands"]["convert"]["rc"] == 0
    assert set(doc["targets"]) == {"convert_peak_rss"} and doc["zeros"] and doc["skip_generate"]
    shards = sorted((work / "hf-tiny-moe-target").glob("*.safetensors"))
    assert len(shards) >= 2 and sum(f.stat().st_blocks for f in shards) * 512 < sum(f.stat().st_size for f in shards)
    from safetensors.numpy import load_file
    assert all(not v.any() for f in shards for v in load_file(str(f)).values())
    assert doc["bytes"]["converted"] > 0


def test_checkpoint_bad_input_exits_2_before_any_work(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (out / "x").write_text("")
    assert checkpoint.main(["--model", "tiny", "--work", str(work), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert checkpoint.main(["--model", "qwen3-9b", "--work", str(work), "--out", str(tmp_path / "o2")]) == 2
    assert "invalid choice" in capsys.readouterr().err
    for extra, why in ((["--skip-convert", "--ckpt-dir", str(tmp_path / "c")], "--skip-convert"),
                       (["--ckpt-dir", str(tmp_path / "missing" / "c")], "does not exist"),
                       (["--skip-convert", "--skip-generate"], "nothing to measure")):
        assert checkpoint.main(["--model", "tiny", "--work", str(work), "--out", str(tmp_path / "o3"), *extra]) == 2
        assert why in capsys.readouterr().err
    assert not work.exists() and not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def test_parse_generate_reads_the_stats_line_with_device_memory():
    from ddtree_jax.cli import stats_line

    res = types.SimpleNamespace(prompt_tokens=5, num_output_tokens=8, prefill_s=0.1, time_s=0.5,
                                acceptance_lengths=[2, 3], rounds=2, stage_ms=None)
    gpu = types.SimpleNamespace(memory_stats=lambda: {"peak_bytes_in_use": 3 * 2**30})
    line = stats_line([res], gpu, {"load": 1.3, "compile": 2.0, "first token": 4.5})
    got = checkpoint.parse_generate("[ddtree] prefill compiled in 1.5s\n[ddtree] " + line + "\n")
    assert got["load_s"] == 1.3 and got["compile_s"] == 2.0 and got["first_token_s"] == 4.5
    assert got["device_peak_gib"] == 3.0 and got["generation_tokens_per_s"] == 20.0 and got["compiled_in_s"] == 1.5
