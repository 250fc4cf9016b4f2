"""Skinny products ``x [M, K] @ w [K, N]`` for few rows on Hopper, as one Mosaic GPU kernel.

Why: a verify pass of 17-72 token rows multiplies them by every weight matrix of the target, a
read of the weights (memory-bound: 2 x rows FLOP per 2 weight bytes). In DDTree-64's round
(bench/RESULTS.md, session 16) XLA's GEMMs read gate_up at 4.0 TB/s but qkv at 3.2, down at 3.4
and o at 2.8: ~0.4-0.7 ms a round below what the weights' bytes need at ~4.3 TB/s. The Triton
kernel (matmul.py) matched XLA at best. This one streams the weights by TMA through a ring of
``stages`` shared-memory slots, filled by a memory warpgroup ahead of the compute warpgroups
(warp specialization), so the bytes in flight do not wait on the products.

Status: measured and not used (bench/RESULTS.md, session 26, s26d). On the H200 its best configs
read the weights at 2.1-3.5 TB/s, slower than XLA's dot (with split-K 1, as the round runs it) at
every verify shape: at 65 rows o 14.3 us against 11.6, qkv 21.0 against 17.7, down 33.4 against
30.4, gate_up 66.7 against 50.8. Every CTA reads all of x from L2 (for gate_up ~113 MB against
the weights' 201 MB), and more CTAs were slower. Next to try: TMA multicast of x across a
cluster, 256 columns a CTA, x boxes of the real rows only. bench_gemm's ``mgpu:`` variants time it.

Layout: a CTA owns ``compute_wgs * block_n`` columns of w and one share of K (``parts`` shares);
each compute warpgroup accumulates ``x_tile [Mp, block_k] @ w_tile [block_k, block_n]`` by
wgmma, Mp = the rows rounded up to 64 (a wgmma's M; the x tile's rows past M arrive as zeros from
TMA, and the products of those rows are never stored). x is read by every CTA (from L2); w once.
With ``parts > 1`` each share writes float32 partials ``[parts, Mo, N]`` that the caller sums
(``matmul_mgpu`` sums them in one XLA fusion); else the output in x's dtype. Mo = M rounded up
to 8: the stores are TMA boxes of 8 rows, none past the array.

CPU: the same kernel runs in Mosaic GPU's interpret mode (``interpret=True``) with the product
as a plain dot (the interpreter takes no wgmma), as tree_attention_mgpu.py does.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
from jax import lax

from .tree_attention_mgpu import interpret_params, wait_if_interpreted

try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError:  # pragma: no cover - depends on the installed jax
    plgpu = None

__all__ = ["MgpuMatmulConfig", "matmul_mgpu", "mgpu_matmul_unsupported", "parse_config"]

WGMMA_M = 64


@dataclasses.dataclass(frozen=True)
class MgpuMatmulConfig:
    """Static knobs of the kernel."""
    block_n: int = 64        # columns of w a compute warpgroup owns
    compute_wgs: int = 2     # compute warpgroups a CTA (a CTA owns compute_wgs * block_n columns)
    block_k: int = 64        # rows of w (columns of x) a ring slot holds
    stages: int = 4          # ring slots
    parts: int = 1           # K shares (CTAs along K), each writing float32 partials when > 1

    def smem_bytes(self, mp: int, itemsize: int = 2) -> int:
        ring = self.stages * self.block_k * (mp + self.compute_wgs * self.block_n) * itemsize
        out = self.compute_wgs * mp * self.block_n * (4 if self.parts > 1 else itemsize)
        return ring + out


def parse_config(spec: str) -> MgpuMatmulConfig:
    """``BNxWGSxBKxSTAGESxPARTS`` -> MgpuMatmulConfig, e.g. 64x2x64x6x2."""
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)x(\d+)", spec.strip())
    if not m:
        raise ValueError(f"matmul config {spec!r}: give BNxWGSxBKxSTAGESxPARTS, e.g. 64x2x64x6x2")
    return MgpuMatmulConfig(*(int(v) for v in m.groups()))


def _padded(m: int) -> tuple[int, int]:
    """(Mp: rows of the x tile and the accumulator, Mo: rows of the output)."""
    return -(-m // WGMMA_M) * WGMMA_M, -(-m // 8) * 8


def mgpu_matmul_unsupported(x_shape, w_shape, dtype, cfg: MgpuMatmulConfig) -> str | None:
    """Why the kernel cannot take these operands (None if it can)."""
    if plgpu is None:
        return "this jax has no Mosaic GPU Pallas module"
    if len(x_shape) != 2 or len(w_shape) != 2 or x_shape[1] != w_shape[0]:
        return f"shapes {x_shape} @ {w_shape} (x [M, K] @ w [K, N])"
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"dtype {dtype} (wgmma takes bf16 / f16 here)"
    (m, k), n = x_shape, w_shape[1]
    mp, _ = _padded(m)
    if mp > 2 * WGMMA_M:
        return f"{m} rows (at most 128: the accumulator holds every row)"
    if cfg.block_n % 64 or cfg.block_k % 64 or cfg.compute_wgs not in (1, 2) or cfg.stages < 2 or cfg.parts < 1:
        return f"config {cfg} (block_n and block_k multiples of 64, 1-2 compute warpgroups, >= 2 stages)"
    cols = cfg.compute_wgs * cfg.block_n
    if n % cols:
        return f"N = {n} is not a multiple of the CTA's {cols} columns"
    if k % (cfg.parts * cfg.block_k):
        return f"K = {k} does not split into {cfg.parts} shares of whole {cfg.block_k}-row steps"
    if cfg.smem_bytes(mp) > 220 * 1024:
        return f"config {cfg} needs {cfg.smem_bytes(mp)} bytes of shared memory at {m} rows"
    return None


def _kernel(x_ref, w_ref, o_ref, x_smem, w_smem, o_smem, x_bar, w_bar, free, *, m: int, cfg: MgpuMatmulConfig,
            interpret: bool):
    """One CTA: (column block j, K share p); warpgroups 0..compute_wgs-1 compute, the last loads."""
    bn, nwg, bk, stages = cfg.block_n, cfg.compute_wgs, cfg.block_k, cfg.stages
    mp, mo = _padded(m)
    k_share = x_ref.shape[1] // cfg.parts
    steps = k_share // bk
    j, p = lax.axis_index("j"), lax.axis_index("p")
    wg = lax.axis_index("wg")
    k0 = p * k_share
    n0 = j * (nwg * bn)
    row0 = j * 0          # traced: the x box may run past M (TMA zero-fills those rows)

    @pl.when(wg == nwg)
    def _memory():
        if nwg == 2 and not interpret:
            plgpu.set_max_registers(40, action="decrease")

        def issue(s, carry):
            slot = lax.rem(s, stages)

            @pl.when(s >= stages)
            def _():
                plgpu.barrier_wait(free.at[slot])

            k = k0 + s * bk
            for i in range(nwg):   # each compute warpgroup's columns: its own box and barrier
                plgpu.copy_gmem_to_smem(w_ref.at[pl.ds(k, bk), pl.ds(n0 + i * bn, bn)], w_smem.at[slot, i],
                                        w_bar.at[slot * nwg + i])
            plgpu.copy_gmem_to_smem(x_ref.at[pl.ds(row0, mp), pl.ds(k, bk)], x_smem.at[slot], x_bar.at[slot])
            return carry

        lax.fori_loop(0, steps, issue, None)

        def drain(s, carry):   # every phase waited, as the interpreter checks
            plgpu.barrier_wait(free.at[lax.rem(s, stages)])
            return carry

        lax.fori_loop(max(steps - stages, 0), steps, drain, None)

    @pl.when(wg < nwg)
    def _compute():
        if nwg == 2 and not interpret:
            plgpu.set_max_registers(232, action="increase")

        def ready(slot):
            plgpu.barrier_wait(w_bar.at[slot * nwg + wg])
            plgpu.barrier_wait(x_bar.at[slot])

        if interpret:
            def body(s, acc):
                slot = lax.rem(s, stages)
                ready(slot)
                acc = acc + lax.dot_general(x_smem.at[slot][...], w_smem.at[slot, wg][...],
                                            (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
                plgpu.barrier_arrive(free.at[slot])
                return acc
            acc = lax.fori_loop(0, steps, body, jnp.zeros((mp, bn), jnp.float32))
        else:
            def run(acc_ref):
                def body(s, carry):
                    slot = lax.rem(s, stages)
                    ready(slot)
                    plgpu.wgmma(acc_ref, x_smem.at[slot], w_smem.at[slot, wg])
                    plgpu.wgmma_wait(1)           # step s - 1's product is done: free its slot

                    @pl.when(s > 0)
                    def _():
                        plgpu.barrier_arrive(free.at[lax.rem(s + stages - 1, stages)])
                    return carry

                lax.fori_loop(0, steps, body, None)
                plgpu.wgmma_wait(0)
                plgpu.barrier_arrive(free.at[lax.rem(steps - 1, stages)])
                return acc_ref[...]
            acc = pl.run_scoped(run, plgpu.ACC((mp, bn), jnp.float32))

        out = o_smem.at[wg]
        out[...] = acc.astype(o_smem.dtype)
        plgpu.commit_smem()
        dst = o_ref.at[p] if cfg.parts > 1 else o_ref
        for r in range(0, mo, 8):
            plgpu.copy_smem_to_gmem(out.at[pl.ds(r, 8)], dst.at[pl.ds(r, 8), pl.ds(n0 + wg * bn, bn)])
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _call(x, w, *, cfg: MgpuMatmulConfig, interpret: bool):
    (m, k), n = x.shape, w.shape[1]
    mp, mo = _padded(m)
    dt = x.dtype
    nwg, bn, bk = cfg.compute_wgs, cfg.block_n, cfg.block_k
    tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    out_dt = jnp.float32 if cfg.parts > 1 else dt
    out_tiled = (plgpu.TilingTransform((8, 32 if out_dt == jnp.float32 else 64)), plgpu.SwizzleTransform(128))
    out_type = jax.ShapeDtypeStruct((cfg.parts, mo, n) if cfg.parts > 1 else (mo, n), out_dt)

    def entry(x_ref, w_ref, o_ref):
        pl.run_scoped(
            lambda *scratch: _kernel(x_ref, w_ref, o_ref, *scratch, m=m, cfg=cfg, interpret=interpret),
            plgpu.SMEM((cfg.stages, mp, bk), dt, transforms=tiled),
            plgpu.SMEM((cfg.stages, nwg, bk, bn), dt, transforms=tiled),
            plgpu.SMEM((nwg, mp, bn), out_dt, transforms=out_tiled),
            plgpu.Barrier(num_barriers=cfg.stages),
            plgpu.Barrier(num_barriers=cfg.stages * nwg),
            plgpu.Barrier(num_arrivals=nwg, num_barriers=cfg.stages),
            collective_axes="wg",
        )

    return plgpu.kernel(
        entry,
        out_type=out_type,
        grid=(n // (nwg * bn), cfg.parts),
        grid_names=("j", "p"),
        num_threads=nwg + 1,
        thread_name="wg",
        interpret=interpret_params() if interpret else None,
    )(x, w)


_call_jit = jax.jit(_call, static_argnames=("cfg", "interpret"))


def matmul_mgpu(x: jax.Array, w: jax.Array, *, config: MgpuMatmulConfig | None = None, interpret: bool = False,
                partials: bool = False) -> jax.Array:
    """x [M, K] @ w [K, N] (M <= 128) with float32 accumulation, in x's dtype; with
    config.parts > 1 and partials=True the float32 partials [parts, M, N] instead of their sum
    (for a consumer that sums them as it reads them)."""
    cfg = config or MgpuMatmulConfig()
    why = mgpu_matmul_unsupported(x.shape, w.shape, x.dtype, cfg)
    if why:
        raise ValueError(f"the Mosaic GPU matmul kernel cannot take these operands: {why}")
    m = x.shape[0]
    mo = _padded(m)[1]
    if mo != m:   # TMA takes a tiled array's rows in whole 8-row tiles: one small XLA pad
        x = jnp.pad(x, ((0, mo - m), (0, 0)))
    out = wait_if_interpreted(_call_jit(x, w.astype(x.dtype), cfg=cfg, interpret=interpret), interpret)
    if cfg.parts == 1:
        return out[:m]
    return out[:, :m] if partials else out[:, :m].sum(0).astype(x.dtype)
