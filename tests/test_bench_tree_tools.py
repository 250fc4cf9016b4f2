"""The tree-build benchmarks and device checks in their CPU smoke modes."""
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
