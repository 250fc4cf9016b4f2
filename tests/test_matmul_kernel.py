"""ddtree_jax.kernels.matmul: the skinny-matmul kernel (interpret mode) against the XLA dot, the
CUDA lowering, and the models' wiring (KernelTuning.matmul, through ddtree_jax.kernels.dispatch)."""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels import matmul as mm
from ddtree_jax.kernels.stacking import StackedRow
from ddtree_jax.tuning import CPU_KERNELS, GPU_KERNELS
from tests.test_kernels import _verified_triton_modules


def rand(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32).astype(dtype)


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


# (the dtypes alternate over the cases: each case's interpret-mode compile costs seconds)
@pytest.mark.parametrize("m,k,n,cfg,dtype", [
    (1, 256, 128, mm.MatmulConfig(block_n=64, block_k=64), jnp.bfloat16),
    (3, 128, 200, mm.MatmulConfig(block_n=64, block_k=64), jnp.float32),              # ragged last column block
    (16, 256, 96, mm.MatmulConfig(block_n=32, block_k=128, split_k=2), jnp.bfloat16),
    (17, 512, 64, mm.MatmulConfig(block_n=64, block_k=64, split_k=4), jnp.float32),
    (65, 128, 130, mm.MatmulConfig(block_n=128, block_k=32), jnp.bfloat16),           # 64-row tile + 16-row tail
    (65, 128, 130, mm.MatmulConfig(block_n=128, block_k=32), jnp.float32),
    (65, 128, 64, mm.MatmulConfig(block_n=64, block_k=32, tail_rows=False), jnp.bfloat16),  # one 128-row tile
    (80, 256, 64, mm.MatmulConfig(block_n=32, block_k=64, split_k=2), jnp.float32),   # the tail full
    (33, 64, 96, mm.MatmulConfig(block_n=32, block_k=64), jnp.bfloat16),              # 32 + 16 rows
    (128, 64, 48, mm.MatmulConfig(block_n=16, block_k=64), jnp.float32),              # a power of two: no row mask
])
def test_kernel_matches_xla(m, k, n, cfg, dtype):
    rng = np.random.default_rng(m * 1000 + n)
    x, w = rand(rng, (m, k), dtype), rand(rng, (k, n), dtype)
    ref = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    out = mm.matmul(x, w, impl="pallas_interpret", config=cfg)
    assert out.shape == (m, n) and out.dtype == dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    # float32: IEEE dots, only the summation order differs; bf16: one rounding of the output
    assert rel_err(out, ref) < (1e-6 if dtype == jnp.float32 else 4e-3)
    xla = mm.matmul(x, w, impl="xla")
    assert rel_err(out, xla) < (1e-6 if dtype == jnp.float32 else 4e-3)


SWAP = dict(swap_ab=True)


# swap_ab: the accumulator is [block_n, rows] (w_tile^T @ x_tile^T), transposed after the K loop;
# the same cases of every fusion the kernel has, so the transposed path is exercised with each
@pytest.mark.parametrize("m,k,n,cfg,dtype,prologue,residual,int8", [
    (1, 256, 128, mm.MatmulConfig(block_n=64, block_k=64, **SWAP), jnp.bfloat16, None, False, False),
    (65, 128, 130, mm.MatmulConfig(block_n=128, block_k=32, **SWAP), jnp.float32, None, False, False),  # tail tile
    (65, 128, 64, mm.MatmulConfig(block_n=64, block_k=32, tail_rows=False, **SWAP), jnp.bfloat16, None, True, False),
    (17, 512, 64, mm.MatmulConfig(block_n=64, block_k=64, split_k=4, **SWAP), jnp.float32, None, True, False),
    (16, 64, 96, mm.MatmulConfig(block_n=32, block_k=32, **SWAP), jnp.bfloat16, "swiglu", True, False),
    (65, 256, 96, mm.MatmulConfig(block_n=32, block_k=64, **SWAP), jnp.float32, "rmsnorm", False, False),
    (15, 64, 300, mm.MatmulConfig(block_n=128, block_k=64, **SWAP), jnp.bfloat16, None, False, True),  # int8
    (65, 128, 96, mm.MatmulConfig(block_n=32, block_k=64, **SWAP), jnp.bfloat16, "swiglu", False, True),
])
def test_swapped_operands(m, k, n, cfg, dtype, prologue, residual, int8):
    """MatmulConfig(swap_ab=True) gives the unswapped kernel's product (float32: to summation
    order; bf16: one rounding) and XLA's, with every prologue, the residual, split-K, int8."""
    rng = np.random.default_rng(m * 13 + n + k)
    x = rand(rng, (m, 2 * k if prologue == "swiglu" else k), dtype)
    w = rand(rng, (k, n), jnp.float32)
    w = mm.quantize_int8(w) if int8 else w.astype(dtype)
    nw = (1.0 + 0.3 * rand(rng, (k,), jnp.float32)).astype(dtype) if prologue == "rmsnorm" else None
    kw = dict(prologue=prologue, norm_w=nw, eps=1e-6, residual=rand(rng, (m, n), dtype) if residual else None)
    got = mm.matmul(x, w, impl="pallas_interpret", config=cfg, **kw)
    plain = mm.matmul(x, w, impl="pallas_interpret", config=dataclasses.replace(cfg, swap_ab=False), **kw)
    ref = mm.matmul(x, w, impl="xla", **kw)
    assert got.shape == (m, n) and got.dtype == dtype and np.isfinite(np.asarray(got, np.float32)).all()
    tol = 1e-5 if dtype == jnp.float32 else 1.2e-2
    assert rel_err(got, plain) < tol and rel_err(got, ref) < tol


def test_config_flags_from_a_table_row():
    """Tables store MatmulConfig's fields in order, flags as 0/1 (bench_gemm's pallas:BNxBKx...
    variants too): they come back as bools, and a 6-field row (before swap_ab) still reads."""
    assert mm.MatmulConfig(64, 128, 4, 4, 2, 1, 1) == mm.MatmulConfig(64, 128, 4, 4, 2, True, True)
    assert mm.MatmulConfig(*[64, 128, 4, 4, 2, True]).swap_ab is False
    assert dataclasses.astuple(mm.MatmulConfig(swap_ab=1))[6] is True


@pytest.mark.parametrize("m,k,n,cfg,dtype", [
    (1, 128, 64, mm.MatmulConfig(block_n=32, block_k=64), jnp.float32),
    (65, 256, 96, mm.MatmulConfig(block_n=32, block_k=64, split_k=2), jnp.bfloat16),
    (16, 64, 200, mm.MatmulConfig(block_n=64, block_k=32), jnp.float32),
])
def test_swiglu_prologue(m, k, n, cfg, dtype):
    """The down projection straight from the gate_up output: swiglu(x) @ w, x = [gate ; up]."""
    rng = np.random.default_rng(m + k + n)
    x, w = rand(rng, (m, 2 * k), dtype), rand(rng, (k, n), dtype)
    out = mm.matmul(x, w, impl="pallas_interpret", config=cfg, prologue="swiglu")
    ref = mm.matmul(x, w, impl="xla", prologue="swiglu")
    g, u = np.split(np.asarray(x, np.float64), 2, axis=-1)
    exact = (g / (1 + np.exp(-g)) * u) @ np.asarray(w, np.float64)
    assert out.shape == (m, n) and out.dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1e-2   # bf16: the activation is rounded before the dot
    assert rel_err(out, exact) < tol and rel_err(ref, exact) < tol
    with pytest.raises(ValueError, match="2K columns"):
        mm.matmul(x[:, :k], w, impl="xla", prologue="swiglu")


@pytest.mark.parametrize("m,k,n,cfg,prologue,out", [
    (1, 128, 64, mm.MatmulConfig(block_n=32, block_k=64), None, None),
    (65, 256, 200, mm.MatmulConfig(block_n=64, block_k=64, split_k=2), None, None),   # ragged columns
    (16, 64, 96, mm.MatmulConfig(block_n=32, block_k=32), "swiglu", None),
    (15, 64, 300, mm.MatmulConfig(block_n=128, block_k=64), None, jnp.float32),        # a drafting LM head
])
def test_int8_weights(m, k, n, cfg, prologue, out):
    """Int8Weight: the kernel (int8 tiles, per-column scales) equals XLA's dequantized product
    up to float32 summation order, and both are the product with the dequantized weight."""
    rng = np.random.default_rng(m * 7 + n)
    x = rand(rng, (m, 2 * k if prologue else k), jnp.bfloat16)
    w = rand(rng, (k, n), jnp.float32) * jnp.asarray(rng.uniform(0.1, 3.0, n), jnp.float32)
    qw = mm.quantize_int8(w)
    assert qw.q.dtype == jnp.int8 and qw.scale.shape == (n,) and qw.nbytes == k * n + 4 * n
    deq = np.asarray(qw.q, np.float64) * np.asarray(qw.scale, np.float64)
    assert np.abs(deq - np.asarray(w)).max() <= np.asarray(qw.scale).max() / 2 + 1e-6   # half a step
    got = mm.matmul(x, qw, impl="pallas_interpret", config=cfg, prologue=prologue, out_dtype=out)
    ref = mm.matmul(x, qw, impl="xla", prologue=prologue, out_dtype=out)
    xin = np.asarray(mm.swiglu(x) if prologue else x, np.float64)
    exact = xin @ deq
    assert got.dtype == (out or jnp.bfloat16) and got.shape == (m, n)
    tol = 1e-2 if prologue else 4e-3   # swiglu: the activation is rounded to bf16 before the dot
    assert rel_err(got, exact) < tol and rel_err(ref, exact) < tol
    assert rel_err(got, ref) < tol


@pytest.mark.parametrize("m,k,n,cfg,prologue,residual,int8,dtype", [
    (1, 128, 64, mm.MatmulConfig(block_n=32, block_k=64), "rmsnorm", False, False, jnp.float32),
    (65, 256, 96, mm.MatmulConfig(block_n=32, block_k=64, split_k=2), "rmsnorm", True, False, jnp.bfloat16),  # split -> 1
    (65, 256, 96, mm.MatmulConfig(block_n=32, block_k=64, split_k=2), "rmsnorm", True, False, jnp.float32),
    (17, 64, 200, mm.MatmulConfig(block_n=64, block_k=32), None, True, False, jnp.bfloat16),        # ragged columns
    (65, 128, 64, mm.MatmulConfig(block_n=32, block_k=32, split_k=4), None, True, False, jnp.float32),  # after a split
    (16, 64, 96, mm.MatmulConfig(block_n=32, block_k=32), "swiglu", True, False, jnp.bfloat16),     # MLP down + residual
    (5, 128, 64, mm.MatmulConfig(block_n=64, block_k=64), "rmsnorm", True, True, jnp.float32),
])
def test_norm_prologue_and_residual_epilogue(m, k, n, cfg, prologue, residual, int8, dtype):
    """The decoder's fusions: rms_norm(x) @ w with the row scale applied after the product, and
    residual + product; the kernel against XLA's path and the float64 math."""
    rng = np.random.default_rng(m * 31 + n + k)
    x = rand(rng, (m, 2 * k if prologue == "swiglu" else k), dtype) * 2.0
    w = rand(rng, (k, n), jnp.float32)
    w = mm.quantize_int8(w) if int8 else w.astype(dtype)
    nw = (1.0 + 0.3 * rand(rng, (k,), jnp.float32)).astype(dtype) if prologue == "rmsnorm" else None
    r = rand(rng, (m, n), dtype) if residual else None
    kw = dict(prologue=prologue, norm_w=nw, eps=1e-6, residual=r)
    got = mm.matmul(x, w, impl="pallas_interpret", config=cfg, **kw)
    ref = mm.matmul(x, w, impl="xla", **kw)
    x64 = np.asarray(x, np.float64)
    if prologue == "rmsnorm":
        x64 = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-6) * np.asarray(nw, np.float64)
    elif prologue == "swiglu":
        g, u = np.split(x64, 2, axis=-1)
        x64 = g / (1 + np.exp(-g)) * u
    w64 = (np.asarray(w.q, np.float64) * np.asarray(w.scale, np.float64)) if int8 else np.asarray(w, np.float64)
    exact = x64 @ w64 + (0 if r is None else np.asarray(r, np.float64))
    assert got.shape == (m, n) and got.dtype == dtype
    tol = 1e-5 if dtype == jnp.float32 else 1.2e-2
    assert rel_err(got, exact) < tol and rel_err(ref, exact) < tol
    assert rel_err(got, ref) < tol


# K in several block_k steps (the norm weight is read a K slice a step), the swapped operands,
# int8 weights, the residual
@pytest.mark.parametrize("m,k,n,cfg,dtype,residual,int8", [
    (5, 128, 64, mm.MatmulConfig(block_n=32, block_k=32), jnp.float32, False, False),
    (17, 128, 96, mm.MatmulConfig(block_n=32, block_k=64, swap_ab=True), jnp.bfloat16, True, False),
    (5, 128, 64, mm.MatmulConfig(block_n=64, block_k=64), jnp.float32, True, True),
])
def test_stacked_norm_weight(m, k, n, cfg, dtype, residual, int8):
    """norm_w stacked [L, K] with norm_layer (a Python int, or traced: one compiled kernel for
    every layer) is the call with row norm_layer, bit for bit; the other rows (NaN) are never
    read; a traced layer past the stack is clamped to its last row, as XLA's path clamps it
    (interpret mode's ref reads clamp as well: only a GPU run tells the kernel's own clamp)."""
    rng = np.random.default_rng(m + n)
    x = rand(rng, (m, k), dtype) * 2.0
    w = rand(rng, (k, n), jnp.float32)
    w = mm.quantize_int8(w) if int8 else w.astype(dtype)
    nw = (1.0 + 0.3 * rand(rng, (k,), jnp.float32)).astype(dtype)
    stacked = jnp.full((3, k), jnp.nan, dtype).at[1].set(nw)
    r = rand(rng, (m, n), dtype) if residual else None
    kw = dict(prologue="rmsnorm", eps=1e-6, residual=r)
    run = jax.jit(lambda nw_, layer, impl: mm.matmul(x, w, impl=impl, config=cfg, norm_w=nw_, norm_layer=layer, **kw),
                  static_argnums=2)
    one = mm.matmul(x, w, impl="pallas_interpret", config=cfg, norm_w=nw, **kw)
    assert np.isfinite(np.asarray(one, np.float32)).all()
    np.testing.assert_array_equal(mm.matmul(x, w, impl="pallas_interpret", config=cfg, norm_w=stacked,
                                            norm_layer=1, **kw), one)
    np.testing.assert_array_equal(mm.matmul(x, w, impl="pallas_interpret", config=cfg,
                                            norm_w=StackedRow(stacked, 1), **kw), one)   # the models' form
    np.testing.assert_array_equal(run(stacked, jnp.int32(1), "pallas_interpret"), one)
    last = stacked.at[2].set(nw)
    np.testing.assert_array_equal(run(last, jnp.int32(7), "pallas_interpret"), one)   # the same kernel
    ref = mm.matmul(x, w, impl="xla", norm_w=stacked, norm_layer=1, **kw)
    np.testing.assert_array_equal(ref, mm.matmul(x, w, impl="xla", norm_w=nw, **kw))
    np.testing.assert_array_equal(ref, mm.matmul_reference(x, w, prologue="rmsnorm", norm_w=StackedRow(stacked, 1),
                                                           eps=1e-6, residual=r))
    tol = 1e-5 if dtype == jnp.float32 else 1.2e-2   # (XLA fuses the jitted path differently)
    for got in (one, run(stacked, jnp.int32(1), "xla"), run(last, jnp.int32(7), "xla")):
        assert rel_err(got, ref) < tol


def test_norm_layer_arguments_are_checked():
    """A stacked norm weight's misuses: one-line ValueErrors, on every path."""
    x, w, k = jnp.ones((2, 64)), jnp.ones((64, 32)), 64
    stacked = jnp.ones((3, k))
    for kw, match in [
        (dict(norm_w=jnp.ones(k), norm_layer=0), r"norm_w stacked as \[L, K = 64\], got \(64,\)"),
        (dict(norm_w=jnp.ones((3, 63)), norm_layer=0), r"stacked as \[L, K = 64\], got \(3, 63\)"),
        (dict(norm_w=stacked, norm_layer=3), r"norm_layer 3 is outside \[0, 3\)"),
        (dict(norm_w=stacked, norm_layer=-1), r"norm_layer -1 is outside"),
        (dict(norm_w=stacked, norm_layer=jnp.float32(1)), "integer scalar"),
        (dict(norm_w=stacked, norm_layer=jnp.zeros(2, jnp.int32)), "integer scalar"),
        (dict(norm_w=stacked), "needs norm_layer"),
        (dict(norm_w=StackedRow(stacked, 3)), r"norm_layer 3 is outside \[0, 3\)"),
        (dict(norm_w=StackedRow(stacked, 1), norm_layer=1), "carries its own layer"),
    ]:
        for impl in ("xla", "pallas_interpret"):
            with pytest.raises(ValueError, match=match):
                mm.matmul(x, w, impl=impl, prologue="rmsnorm", **kw)
        with pytest.raises(ValueError, match=match):
            mm.matmul_reference(x, w, prologue="rmsnorm", **kw)
    with pytest.raises(ValueError, match="norm_layer goes with prologue='rmsnorm'"):
        mm.matmul(x, w, impl="xla", norm_layer=0)
    with pytest.raises(ValueError, match="norm_layer goes with prologue='rmsnorm'"):
        mm.matmul(jnp.ones((2, 2 * k)), w, impl="xla", prologue="swiglu", norm_layer=0)


def test_fusion_arguments_are_checked():
    x, w = jnp.ones((2, 64)), jnp.ones((64, 32))
    with pytest.raises(ValueError, match="norm_w goes with"):
        mm.matmul(x, w, prologue="rmsnorm")
    with pytest.raises(ValueError, match="unknown matmul prologue"):
        mm.matmul(x, w, prologue="gelu")
    with pytest.raises(ValueError, match="residual"):
        mm.matmul(x, w, residual=jnp.ones((2, 31)))
    assert mm.kernel_path((2, 64), w, impl="pallas_interpret") == "pallas_interpret"
    assert mm.kernel_path((200, 64), w, impl="pallas_interpret") == "xla"      # more rows than a tile
    assert dispatch.matmul_path(CPU_KERNELS, (2, 64), w) == "xla"               # auto on the CPU
    assert dispatch.matmul_path(GPU_KERNELS, (2, 64), w) == "xla"               # auto where no table entry
    with pytest.raises(ValueError, match="chosen per device"):
        mm.matmul(x, w, impl="auto")


def test_float32_output_and_leading_dims():
    """The LM head's form: bf16 operands, float32 logits, [Bt, T, H] rows flattened."""
    rng = np.random.default_rng(0)
    x, w = rand(rng, (2, 5, 64), jnp.bfloat16), rand(rng, (64, 300), jnp.bfloat16)
    out = mm.matmul(x, w, out_dtype=jnp.float32, impl="pallas_interpret",
                    config=mm.MatmulConfig(block_n=128, block_k=32))
    ref = jnp.einsum("bth,hv->btv", x, w, preferred_element_type=jnp.float32)
    assert out.shape == (2, 5, 300) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-4)


def test_row_tiles():
    plan = lambda m, **kw: mm.matmul_plan(m, 4096, 4096, mm.MatmulConfig(**kw))  # noqa: E731
    assert (plan(65).block_m, plan(65).tail_m) == (64, 16)
    assert (plan(80).block_m, plan(80).tail_m) == (64, 16)
    assert (plan(81).block_m, plan(81).tail_m) == (128, 0)
    assert (plan(65, tail_rows=False).block_m, plan(65, tail_rows=False).tail_m) == (128, 0)
    assert (plan(17).block_m, plan(17).tail_m) == (32, 0)
    assert (plan(1).block_m, plan(64).block_m, plan(128).block_m) == (16, 64, 128)


def test_default_configs_cover_the_8b_shapes():
    """The default config takes every projection of the Qwen3-8B verify/drafter/decode shapes and
    keeps at least ~128 programs busy."""
    shapes = [(4096, 6144), (4096, 4096), (4096, 24576), (12288, 4096), (4096, 151936), (4096, 2048),
              (20480, 4096)]
    for m in (1, 15, 16, 65, 128):
        for k, n in shapes:
            cfg = mm.default_matmul_config(m, k, n)
            plan = mm.matmul_plan(m, k, n, cfg)
            assert plan.col_blocks * plan.split_k >= 64, (m, k, n, plan)
            assert plan.steps * plan.block_k * plan.split_k == k


def test_bad_shapes_and_impls():
    with pytest.raises(ValueError, match="129 rows"):
        mm.matmul_plan(129, 64, 32, mm.MatmulConfig())
    with pytest.raises(ValueError, match="multiple of block_k"):
        mm.matmul_plan(4, 96, 32, mm.MatmulConfig(block_k=64))
    with pytest.raises(ValueError, match="not a power of two"):
        mm.matmul_plan(4, 96, 32, mm.MatmulConfig(block_k=128))
    w = jnp.ones((64, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="does not match"):
        mm.matmul(jnp.ones((2, 63)), w, impl="xla")
    with pytest.raises(ValueError, match="unknown matmul impl"):
        mm.matmul(jnp.ones((2, 64)), w, impl="cuda")
    # shapes the kernel cannot take (a prompt's rows, a ragged K) go to the XLA dot, bit for bit
    rng = np.random.default_rng(3)
    for m, k in ((129, 64), (4, 96)):
        x, w = rand(rng, (m, k), jnp.float32), rand(rng, (k, 32), jnp.float32)
        np.testing.assert_array_equal(mm.matmul(x, w, impl="pallas_interpret", config=mm.MatmulConfig(block_k=64)),
                                      mm.matmul(x, w, impl="xla"))
    # "auto" on the CPU is the XLA dot, bit for bit
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 64)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(2).standard_normal((64, 32)), jnp.float32)
    np.testing.assert_array_equal(mm.matmul(x, w), jnp.einsum("...i,io->...o", x, w))


@pytest.mark.skipif(mm.pltriton is None, reason="this jax has no Pallas Triton lowering")
@pytest.mark.parametrize("m,k,n,dtype,out,prologue,swap", [
    (1, 4096, 6144, jnp.bfloat16, None, None, False), (65, 4096, 4096, jnp.bfloat16, None, None, False),
    (16, 12288, 4096, jnp.bfloat16, None, "swiglu", False), (65, 12288, 4096, jnp.bfloat16, None, "swiglu", False),
    (65, 4096, 151936, jnp.bfloat16, jnp.float32, None, False), (17, 256, 1000, jnp.float32, None, None, False),
    (65, 4096, 4096, jnp.bfloat16, None, None, True), (16, 4096, 24576, jnp.bfloat16, None, None, True),
    (65, 12288, 4096, jnp.bfloat16, None, "swiglu", True)])
def test_triton_lowering_verifies(monkeypatch, m, k, n, dtype, out, prologue, swap):
    """The GPU path lowers for CUDA (no GPU needed) into one verified Triton module."""
    modules = _verified_triton_modules(monkeypatch)
    sds = jax.ShapeDtypeStruct
    cfg = dataclasses.replace(mm.default_matmul_config(m, k, n), swap_ab=True) if swap else None
    try:
        jax.jit(lambda a, b: mm.matmul(a, b, out_dtype=out, impl="pallas", prologue=prologue, config=cfg)).trace(
            sds((m, 2 * k if prologue else k), dtype), sds((k, n), dtype)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1
    assert modules[0].operation.verify()


def test_engine_with_the_kernel_is_lossless():
    """Every projection and LM head of the round through the kernel (interpret mode, float32; the
    prompts' prefill too: 96 rows fit one tile): DDTree, drafter included, gives the XLA path's
    AR tokens."""
    from ddtree_jax.generator import Generator
    from tiny import tiny_pair

    pair = tiny_pair()
    prompts = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(2, 33))]
    want = [r.token_ids for r in Generator(pair, method="ar", matmul_impl="xla").generate_ids(prompts, max_new_tokens=24)]
    gen = Generator(pair, method="ddtree", budget=24, matmul_impl="pallas_interpret")
    assert [r.token_ids for r in gen.generate_ids(prompts, max_new_tokens=24)] == want


def test_tuned_table(tmp_path):
    """A table (read from its file and checked) gives the measured configs per device kind, shape
    and row range; an unreadable or missing file is a one-line error naming it."""
    table = {"NVIDIA H200": [
        {"k": 4096, "n": 6144, "rows": [17, 128], "config": [64, 128, 4, 4, 2], "us": 14.0, "xla_us": 20.0},
        {"k": 4096, "n": 6144, "rows": [1, 1], "config": [32, 256, 4, 3, 1], "us": 12.0, "xla_us": 12.5}]}
    path = tmp_path / "t.json"
    path.write_text(__import__("json").dumps(table))
    read = mm.matmul_table(path)

    def tuned(*a, **k):
        return mm.tuned_config(*a, **k, table=read)

    assert tuned(65, 4096, 6144, "NVIDIA H200") == mm.MatmulConfig(64, 128, 4, 4, 2)
    assert tuned(1, 4096, 6144, "NVIDIA H200") == mm.MatmulConfig(32, 256, 4, 3, 1)
    assert tuned(16, 4096, 6144, "NVIDIA H200") is None       # rows not measured
    assert tuned(65, 4096, 4096, "NVIDIA H200") is None       # shape not measured
    assert tuned(65, 4096, 6144, "NVIDIA A100") is None       # another GPU
    assert tuned(65, 4096, 6144) is None                      # this CPU
    assert tuned(65, 4096, 6144, "NVIDIA H200", prologue="swiglu") is None  # another kernel
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable matmul table .*bad.json"):
        mm.matmul_table(bad)
    with pytest.raises(ValueError, match="typo.json does not exist"):
        mm.matmul_table(tmp_path / "typo.json")
    bad = tmp_path / "bad2.json"
    bad.write_text(__import__("json").dumps({"NVIDIA H200": [{"k": 1, "n": 1, "rows": [1, 1]}]}))
    with pytest.raises(ValueError, match="bad2.json.*MatmulConfig"):
        mm.matmul_table(bad)


def test_table_entries_for_compile_options(monkeypatch):
    """An entry naming xla_options applies only in an executable compiled with those options
    (KernelTuning.xla_options; compiled_with adds to them); the engine traces a round's stages
    with its executable's options (engine.round_kernels)."""
    split1 = {"xla_gpu_experimental_force_split_k": 1}
    table = {"NVIDIA H200": [
        {"k": 4096, "n": 6144, "rows": [16, 16], "config": [64, 128, 4, 4, 2], "us": 16.0, "xla_us": 21.0,
         "xla_options": split1}]}

    def tuned(m, options=None):
        return mm.tuned_config(m, 4096, 6144, "NVIDIA H200", table=table, xla_options=options)

    want = mm.MatmulConfig(64, 128, 4, 4, 2)
    assert tuned(16) is None
    assert tuned(16, {"xla_gpu_experimental_force_split_k": 2}) is None       # another value
    assert tuned(16, split1) == want
    kernels = GPU_KERNELS.compiled_with(split1).compiled_with({"xla_gpu_enable_pdl": True})   # adds up
    assert tuned(16, dict(kernels.xla_options)) == want
    assert tuned(65, split1) is None       # rows

    # what the engine's stages see: the options of their executable
    from ddtree_jax import engine
    from ddtree_jax.models import family
    from ddtree_jax.tuning import Tuning
    seen = []
    monkeypatch.setattr(family.tmodel, "forward", lambda *a, **k: seen.append(k["kernels"].xla_options) or (0, 0, 0))
    monkeypatch.setattr(family.Dense, "lm_head", staticmethod(lambda *a, **k: 0))
    tree = types.SimpleNamespace(depths=jnp.zeros((1, 1), jnp.int32), tokens=jnp.zeros((1, 1), jnp.int32),
                                 ancestor_mask=jnp.ones((1, 1, 1), bool))
    state = types.SimpleNamespace(length=jnp.zeros(1, jnp.int32), cache=None)
    tcfg = types.SimpleNamespace(num_heads=4, num_kv_heads=1, head_dim=8)
    dcfg = types.SimpleNamespace(depth=15, target_layer_ids=())
    tparams = {"embed": jnp.zeros((2, 32), jnp.bfloat16)}
    tuning = Tuning(round_xla_options=((33, 65, tuple(split1.items())),))
    for budget in (64, 16):
        spec = engine.DecodeSpec(budget=budget, drafter="oracle", tuning=tuning)
        engine.verify_stage(tparams, state, tree, tcfg=tcfg, dcfg=dcfg, spec=spec)
    assert seen == [tuple(split1.items()), ()]


def test_shipped_table_is_valid():
    """Every entry of the shipped table is a config the kernel takes for its shape and rows."""
    import json
    table = json.loads(mm.TABLE_PATH.read_text())
    assert mm.matmul_table() == table        # the default: the shipped table, its entries checked
    for kind, entries in table.items():
        for e in entries:
            lo, hi = e["rows"]
            cfg = mm.MatmulConfig(*e["config"])
            assert 1 <= lo <= hi <= mm.MAX_ROWS, (kind, e)
            assert e.get("prologue") in (None, "swiglu", "rmsnorm") and e.get("weight") in (None, "int8"), (kind, e)
            assert isinstance(e.get("xla_options", {}), dict), (kind, e)
            for m in (lo, hi):
                mm.matmul_plan(m, e["k"], e["n"], cfg)
            assert e["us"] < e["xla_us"], (kind, e)   # only measured wins are in the table


@pytest.mark.skipif(mm.pltriton is None, reason="this jax has no Pallas Triton lowering")
@pytest.mark.parametrize("m,k,n,prologue,residual", [
    (65, 4096, 6144, "rmsnorm", False), (1, 4096, 24576, "rmsnorm", False),
    (65, 4096, 4096, None, True), (16, 12288, 4096, "swiglu", True)])
def test_triton_lowering_of_the_fusions(monkeypatch, m, k, n, prologue, residual):
    modules = _verified_triton_modules(monkeypatch)
    sds, bf = jax.ShapeDtypeStruct, jnp.bfloat16
    cfg = mm.MatmulConfig(block_n=64, block_k=128)

    def fn(x, w, nw, r):
        return mm.matmul(x, w, impl="pallas", config=cfg, prologue=prologue,
                         norm_w=nw if prologue == "rmsnorm" else None, residual=r if residual else None)
    try:
        jax.jit(fn).trace(sds((m, 2 * k if prologue == "swiglu" else k), bf), sds((k, n), bf), sds((k,), bf),
                          sds((m, n), bf)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


@pytest.mark.skipif(mm.pltriton is None, reason="this jax has no Pallas Triton lowering")
@pytest.mark.parametrize("m,k,n,int8,residual,swap", [
    (65, 4096, 6144, False, False, False), (16, 4096, 4096, True, True, True)])
def test_triton_lowering_of_a_stacked_norm(monkeypatch, m, k, n, int8, residual, swap):
    """The norm weight of every layer [L, K] and a traced layer: one verified Triton module."""
    modules = _verified_triton_modules(monkeypatch)
    sds, bf = jax.ShapeDtypeStruct, jnp.bfloat16
    w = mm.Int8Weight(sds((k, n), jnp.int8), sds((n,), jnp.float32)) if int8 else sds((k, n), bf)
    cfg = mm.MatmulConfig(block_n=64, block_k=128, swap_ab=swap)

    def fn(x, w, nw, layer, r):
        return mm.matmul(x, w, impl="pallas", config=cfg, prologue="rmsnorm", norm_w=nw, norm_layer=layer,
                         residual=r if residual else None)
    try:
        jax.jit(fn).trace(sds((m, k), bf), w, sds((36, k), bf), sds((), jnp.int32),
                          sds((m, n), bf)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()


def test_fused_layers_match_the_unfused_forward():
    """target.forward with every projection in the kernel runs the fused layers (norms and
    residual adds inside the products); in float32 it matches the XLA forward: hidden, taps, K/V."""
    from ddtree_jax.models import target as tmodel
    from ddtree_jax.models.layers import KVCache
    from tiny import tiny_pair

    pair = tiny_pair(layers=2)
    tc, tp = pair.target_cfg, tmodel.fuse_params(pair.target_params)
    rng = np.random.default_rng(0)
    cache = KVCache.from_layers([jnp.asarray(rng.standard_normal((2, tc.num_kv_heads, 32, tc.head_dim)), jnp.float32)] * 2,
                                [jnp.asarray(rng.standard_normal((2, tc.num_kv_heads, 32, tc.head_dim)), jnp.float32)] * 2)
    tokens = jnp.asarray(rng.integers(0, tc.vocab_size, (2, 9)), jnp.int32)
    length = jnp.asarray([5, 11], jnp.int32)
    pos = length[:, None] + jnp.arange(9, dtype=jnp.int32)
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((9, 9), bool)), (2, 9, 9))
    kernel, xla = (CPU_KERNELS.with_impls(matmul=impl) for impl in ("pallas_interpret", "xla"))
    assert tmodel._fused_layers(tp, tc, (2, 9, tc.hidden_size), kernel)
    assert not tmodel._fused_layers(tp, tc, (2, 9, tc.hidden_size), xla)
    assert not tmodel._fused_layers(tp, tc, (2, 200, tc.hidden_size), kernel)   # a prompt's rows
    outs = [tmodel.forward(tp, tc, tokens, pos, cache, length, mask, taps=(0, 1), kernels=k) for k in (xla, kernel)]
    for a, b in zip(jax.tree_util.tree_leaves(outs[0]), jax.tree_util.tree_leaves(outs[1])):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-5, atol=2e-5)


def test_fused_drafter_layers_match_the_unfused_pass():
    """drafter.draft_hidden with every product in the kernel runs fused layers; in float32 it
    matches the XLA pass; here the int8 drafter (the same Int8Weights both ways; the engine test
    above runs the bf16 drafter fused)."""
    quant = True
    from ddtree_jax.drafters import dflash as dmodel
    from ddtree_jax.models.layers import KVCache
    from tiny import tiny_pair

    pair = tiny_pair(draft_layers=2)
    dc = pair.drafter_cfg
    dp = dmodel.fuse_params(pair.drafter_params)
    if quant:
        dp = dmodel.quantize_params(dp, pair.target_params["lm_head"])
    rng = np.random.default_rng(1)
    cache = KVCache.from_layers([jnp.asarray(rng.standard_normal((2, dc.num_kv_heads, 40, dc.head_dim)), jnp.float32)] * 2,
                                [jnp.asarray(rng.standard_normal((2, dc.num_kv_heads, 40, dc.head_dim)), jnp.float32)] * 2)
    block = jnp.asarray(rng.standard_normal((2, dc.block_size, dc.hidden_size)), jnp.float32)
    length = jnp.asarray([3, 20], jnp.int32)
    pos = length[:, None] + jnp.arange(dc.block_size, dtype=jnp.int32)
    kernels = [CPU_KERNELS.with_impls(attention="xla", matmul=impl) for impl in ("xla", "pallas_interpret")]
    assert dmodel._fused_layers(dp, dc, block.shape, kernels[1])
    outs = [dmodel.draft_hidden(dp, dc, block, pos, cache, length, kernels=k) for k in kernels]
    np.testing.assert_allclose(np.asarray(outs[1]), np.asarray(outs[0]), rtol=3e-5, atol=3e-5)
