"""Probe (GPU only): what a Pallas Mosaic GPU GEMM reaches at the verify shapes, before building one.

    python3 -m bench.probe_gemm_mgpu --out DIR

Session 26's question. The one lever left for DDTree-256's 9.0 ms is a GEMM of our own (a SwiGLU
epilogue, and better tiles than cuBLAS's at 264 rows), and cuBLAS is a strong baseline. Before
writing one, this times JAX's own warp-specialized Hopper matmul
(jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu: TMA, wgmma, a persistent grid, two compute
warpgroups) on the same shapes, against XLA's dot (cuBLAS). Both are timed by CUPTI
(mosaic.gpu.profiler.measure, median of --iters calls; one weight, so part of it may sit in the
50 MB L2 for both).

Shapes: gate_up (4096 x 24576) and o (4096 x 4096) of the 8B layer at 256 and 264 rows, plain
(x @ w) and swapped (w^T @ x^T, the rows as the MMA's narrow N side, as cuBLAS's 128x136 tile at
264 rows does), and a square 4096 x 8192 x 4096 product for calibration. A config that does not fit
(shared memory, divisibility) is reported and skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import jax
import jax.numpy as jnp


def _configs(hm, swapped: bool, rows: int):
    """(name, TuningConfig) candidates for one problem."""
    M, N = hm.MatmulDimension.M, hm.MatmulDimension.N
    fields = {f.name for f in dataclasses.fields(hm.TuningConfig)}
    out = []

    def add(**kw):
        kw = {k: v for k, v in kw.items() if k in fields}
        name = "_".join(f"{k}={getattr(v, 'name', v)}" for k, v in kw.items())
        out.append((name, hm.TuningConfig(**kw)))

    if swapped:   # out^T [n_w, rows]: the rows are the narrow side
        tn = 88 if rows % 128 else 128
        for tm in (64, 128):
            for steps in (4, 6):
                add(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=steps, epi_tile_m=64,
                    epi_tile_n=None if tn == 88 else 64, grid_minor_dim=M, grid_tile_width=4, wg_dimension=M)
    else:
        for tm, tn, wg in ((128, 128, M), (64, 128, M), (128, 64, N), (128, 128, N)):
            add(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=4, epi_tile_m=64, epi_tile_n=64,
                grid_minor_dim=N, grid_tile_width=4, wg_dimension=wg)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/probe_gemm_mgpu")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    if jax.devices()[0].platform != "gpu":
        print("probe_gemm_mgpu: needs a GPU (Hopper)", file=sys.stderr)
        return 2
    from jax.experimental.mosaic.gpu import profiler
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hm

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []

    def timed(f, *xs):
        _, times = profiler.measure(f, iterations=args.iters)(*xs)
        return statistics.median(times) * 1e3

    problems = [("square", 4096, 4096, 8192, False)]
    for rows in (256, 264):
        for shape, k, n in (("gate_up", 4096, 24576), ("o", 4096, 4096)):
            problems += [(shape, rows, k, n, False), (shape, rows, k, n, True)]
    key = jax.random.key(0)
    for shape, rows, k, n, swapped in problems:
        if not swapped and rows % 128:
            continue   # the plain form needs rows in whole 128-row CTA tiles
        x = jax.random.normal(key, (rows, k), jnp.bfloat16)
        w = (jax.random.normal(jax.random.key(1), (k, n), jnp.float32) / 64).astype(jnp.bfloat16)
        ref = jax.jit(lambda a, b: a @ b)
        xla_us = timed(ref, x, w)
        want = ref(x, w).astype(jnp.float32)
        a, b = (w.T, x.T) if swapped else (x, w)
        a, b = jax.block_until_ready((jnp.asarray(a), jnp.asarray(b)))
        flops = 2 * rows * k * n
        print(f"== {shape} rows={rows} swapped={swapped}: XLA {xla_us:.1f} us "
              f"({flops / xla_us / 1e6:.0f} TFLOP/s)", flush=True)
        for name, cfg in _configs(hm, swapped, rows):
            rec = dict(shape=shape, rows=rows, k=k, n=n, swapped=swapped, config=name, xla_us=xla_us)
            try:
                f = jax.jit(lambda a, b, cfg=cfg: hm.matmul(a, b, None, cfg))
                got = f(a, b)
                got = (got.T if swapped else got).astype(jnp.float32)
                err = float(jnp.max(jnp.abs(got - want)) / (jnp.max(jnp.abs(want)) + 1e-6))
                us = timed(f, a, b)
                rec.update(us=us, rel_err=err, tflops=flops / us / 1e6)
                print(f"   {us:7.1f} us ({flops / us / 1e6:4.0f} TFLOP/s) err {err:.1e}  {name}", flush=True)
            except Exception as e:  # noqa: BLE001 - a probe: report and go on
                rec.update(error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
                print(f"   failed: {rec['error']}  {name}", flush=True)
            results.append(rec)
            (out_dir / "probe_gemm_mgpu.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
