"""The tree-build benchmarks and device checks in their CPU smoke modes."""
from __future__ import annotations

import dataclasses
import json

import jax
import pytest


def test_bench_tree_smoke(tmp_path):
    """bench.bench_tree times the vocabulary top-k variants and the build as tuned, writes its rows;
    bad flags are usage errors."""
    from bench import bench_tree

    assert bench_tree.main(["--vocab", "512", "--budgets", "8,40", "--inner", "2", "--repeats", "1",
                            "--variants", "8x0t,8x0tr4w2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "bench_tree.json").read_text())["rows"]
    assert [r["budget"] for r in rows] == [8, 40]
    assert all(r["build_ms"] > 0 and r["topk2_ms"] > 0 and r["topk_tuned_ms"] > 0
               and r["topk_8x0t_ms"] > 0 and r["topk_8x0tr4w2_ms"] > 0 for r in rows)
    for bad in (["--variants", "8x0q"], ["--set", "rank_by_count_max=lots"], ["--vary", "no_such_field=1"],
                ["--vary", "vocab_topk.chunk=4"], ["--set", "select_barrier=yes"], ["--set", "kernels=triton"],
                ["--tuning", "tpu"]):
        with pytest.raises(SystemExit):
            bench_tree.main(bad)


def test_bench_tree_tunings():
    """--tuning names a TreeTuning (a GPU one interpreted off the GPU); --set / --vary fields parse
    by type, vocab_topk.FIELD into its VocabTopK (made where the tuning has none)."""
    from bench import bench_tree
    from ddtree_jax.tuning import GPU_TREE, TreeTuning, VocabTopK

    gpu = bench_tree.base_tuning("gpu")
    kernels = "pallas" if jax.default_backend() == "gpu" else "pallas_interpret"
    assert gpu == dataclasses.replace(GPU_TREE, kernels=kernels)
    assert bench_tree.base_tuning("cpu") == TreeTuning()
    t = bench_tree.with_setting(TreeTuning(), "vocab_topk.stage2_max_k", "0")
    assert t.vocab_topk == VocabTopK(stage2_max_k=0)
    assert bench_tree.with_setting(gpu, "vocab_topk", "none").vocab_topk is None
    assert bench_tree.with_setting(gpu, "pair_kernel_tile", "32x32x8").pair_kernel_tile == (32, 32, 8)
    assert bench_tree.with_setting(gpu, "select_barrier", "0").select_barrier is False
    assert bench_tree.with_setting(gpu, "ancestor_chain_from", "0").ancestor_chain_from == 0


@pytest.mark.parametrize("vary,suffixes", [
    (["ancestor_chain_from=0,2147483647"], ["ancestor_chain_from0", "ancestor_chain_from2147483647"]),
    (["select_onehot_max=0,100000"], ["select_onehot_max0", "select_onehot_max100000"]),
    (["pair_kernel_from=0,1", "runs_kernel_from=1"], ["pair_kernel_from0_runs_kernel_from1",
                                                     "pair_kernel_from1_runs_kernel_from1"]),
    (["vocab_topk.stage2_select=0,1"], ["vocab_topk.stage2_select0", "vocab_topk.stage2_select1"]),
])
def test_bench_tree_vary_rows(tmp_path, vary, suffixes):
    """Each --vary times the whole build (ancestor mask included) once per value (the product
    over several), its row named by the values, with --trace one traced loop each; the tuning
    itself is untouched."""
    from bench import bench_tree

    args = ["--vocab", "128", "--depth", "3", "--budgets", "8", "--inner", "1", "--repeats", "1", "--tuning", "gpu",
            "--set", "rank_by_count_max=1024", "--trace", "--out", str(tmp_path)]
    for v in vary:
        args += ["--vary", v]
    assert bench_tree.main(args) == 0
    (row,) = json.loads((tmp_path / "bench_tree.json").read_text())["rows"]
    assert sorted(k for k in row if k.startswith("build_ms")) == [f"build_ms_{x}" for x in suffixes]
    # --trace: one traced loop a variant (on the CPU its events are the thunks), nonempty
    traces = [row[f"build_trace_{x}"] for x in suffixes]
    assert all(t["launches"] > 0 and t["span_us"] > 0 and t["kernels_us"] for t in traces)


def test_check_tree_smoke(capsys):
    """bench.check_tree (the device check of the tree build's fast paths) with the GPU's
    tuning in interpret mode: every build equals plain XLA's, exit 0."""
    from bench import check_tree

    assert check_tree.main(["--interpret", "--vocab", "2000", "--depth", "4", "--budgets", "8"]) == 0
    out = capsys.readouterr().out
    assert out.count("equal") >= 6 and "DIFFERENT" not in out and "all equal" in out
