"""The Mosaic GPU skinny matmul (ddtree_jax/kernels/matmul_mgpu.py): interpret mode on the CPU against
a float32 dot, the CUDA lowering at the 8B shapes, the refusals, and bench_gemm's mgpu variant.
The engine does not use the kernel (bench/RESULTS.md, session 26: slower than XLA's dot at every
measured shape); bench_gemm times it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels import matmul_mgpu as mm
from ddtree_jax.kernels.matmul_mgpu import MgpuMatmulConfig, matmul_mgpu

pytestmark = pytest.mark.skipif(mm.plgpu is None, reason="this jax has no Mosaic GPU Pallas module")


def _operands(m, k, n, seed=0):
    x = jax.random.normal(jax.random.key(seed), (m, k), jnp.float32).astype(jnp.bfloat16)
    w = (jax.random.normal(jax.random.key(seed + 1), (k, n), jnp.float32) / 16).astype(jnp.bfloat16)
    return x, w, np.asarray(x, np.float32) @ np.asarray(w, np.float32)


@pytest.mark.parametrize("m,k,n,cfg", [
    # 65 rows (two wgmma row groups, rows past 72 never stored; x padded to 72 rows), two
    # warpgroups, a two-slot ring that wraps, two K shares summed
    (65, 512, 256, MgpuMatmulConfig(block_n=64, compute_wgs=2, block_k=64, stages=2, parts=2)),
    # 17 rows (one row group), one warpgroup, 128-row K steps, three shares
    (17, 384, 128, MgpuMatmulConfig(block_n=64, compute_wgs=1, block_k=128, stages=3, parts=3)),
    # a whole 128-row tile, 128 columns a warpgroup, no split
    (128, 256, 128, MgpuMatmulConfig(block_n=128, compute_wgs=1, block_k=64, stages=2, parts=1)),
])
def test_matches_a_dot_in_interpret_mode(m, k, n, cfg):
    x, w, want = _operands(m, k, n)
    got = matmul_mgpu(x, w, config=cfg, interpret=True)
    assert got.shape == (m, n) and got.dtype == jnp.bfloat16
    got = np.asarray(got, np.float32)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()
    if cfg.parts > 1:   # the float32 partials: their sum is the product
        parts = matmul_mgpu(x, w, config=cfg, interpret=True, partials=True)
        assert parts.shape == (cfg.parts, m, n) and parts.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(parts).sum(0), want, rtol=1e-3, atol=1e-3 * np.abs(want).max())


def test_unsupported_operands_are_named():
    cfg = MgpuMatmulConfig()
    bf = jnp.bfloat16
    assert mm.mgpu_matmul_unsupported((65, 4096), (4096, 4096), bf, cfg) is None
    assert "at most 128" in mm.mgpu_matmul_unsupported((129, 4096), (4096, 4096), bf, cfg)
    assert "dtype" in mm.mgpu_matmul_unsupported((65, 4096), (4096, 4096), jnp.float32, cfg)
    assert "columns" in mm.mgpu_matmul_unsupported((65, 4096), (4096, 4160), bf, cfg)
    assert "shares" in mm.mgpu_matmul_unsupported((65, 4096), (4096, 4096), bf, MgpuMatmulConfig(parts=3))
    assert "shared memory" in mm.mgpu_matmul_unsupported((65, 4096), (4096, 4096), bf, MgpuMatmulConfig(stages=8))
    with pytest.raises(ValueError, match="cannot take these operands.*at most 128"):
        matmul_mgpu(jnp.zeros((200, 256), bf), jnp.zeros((256, 128), bf), interpret=True)
    assert mm.parse_config("64x2x64x4x2") == MgpuMatmulConfig(64, 2, 64, 4, 2)
    with pytest.raises(ValueError, match="BNxWGSxBKxSTAGESxPARTS"):
        mm.parse_config("64x2")


@pytest.mark.parametrize("m,k,n,spec", [(65, 4096, 4096, "64x2x64x4x4"), (72, 12288, 4096, "64x2x128x2x4"),
                                        (17, 4096, 24576, "64x2x64x4x2"), (128, 4096, 6144, "128x1x64x4x1")])
def test_cuda_lowering(m, k, n, spec):
    """The real path (TMA, wgmma, the register budget split) lowers for CUDA at the 8B shapes."""
    cfg = mm.parse_config(spec)
    shapes = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16), jax.ShapeDtypeStruct((k, n), jnp.bfloat16))
    try:
        txt = jax.jit(lambda x, w: matmul_mgpu(x, w, config=cfg)).trace(*shapes).lower(
            lowering_platforms=("cuda",)).as_text()
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert "mosaic_gpu" in txt


def test_bench_gemm_mgpu_variant(tmp_path):
    """bench_gemm's mgpu:CONFIG variant runs the kernel (interpret mode with --small) on the plain
    products, refuses the others, and never enters the Triton kernel's tuned table."""
    import json

    from bench import bench_gemm as bg

    assert bg.parse_variant("mgpu:64x2x64x2x2") == ("mgpu", MgpuMatmulConfig(64, 2, 64, 2, 2))
    assert bg.main(["--small", "--rows", "16", "--variants", "mgpu:64x2x64x2x2", "--reps", "1",
                    "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "bench_gemm.json").read_text())
    plain = {s for s in bg.SMALL if not bg.prologue_of(s) and not s.endswith("_int8")}
    assert {r["shape"] for r in res["rows"]} == plain
    assert all("mgpu takes plain bf16 products only" in e for e in res["errors"])
    # An mgpu row faster than XLA's dot makes no table entry (the table is the Triton kernel's);
    # a pallas row does.
    mine = [dict(r, variant="xla", config=None, wall_us=2 * r["wall_us"]) for r in res["rows"]]   # ranked by wall here
    assert bg.table_entries(res["rows"] + mine, 0.0) == []
    pallas = [dict(r, variant="pallas:64x128x4x4x1", config=[64, 128, 4, 4, 1]) for r in res["rows"]]
    assert len(bg.table_entries(pallas + mine, 0.0)) == len(plain)
