"""The kernel choices, pinned: for simulated devices (H200, H100 SXM and PCIe, A100, V100, CPU) and
a grid of call shapes (decode T = 1, the drafter's T = 16, DDTree verifies of 65-1032 rows, a
prompt piece of 4096; short and long caches; batch 1-16; bf16 and float32; several head
layouts), which kernel each call runs, with which config, and how many rows the engine gives a
verify: what ddtree_jax.kernels.dispatch decides from `tuning_for(device).kernels`. A change in
the table is a change in what runs on some device: one to make on purpose, with its measurement,
never as a side effect of moving code.

Entries read ``T:choice[->rows]``: choice "xla", "pallas" (the Triton kernel; ``*field=value``
where the measured tile table overrides default_config) or "mosaic:CONFIG" (the Mosaic GPU
kernel, CONFIG as parse_config spells it); ``->rows`` where the engine pads the verify.
"""
from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import pytest

from ddtree_jax import tuning
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels import matmul as mm
from ddtree_jax.kernels import tree_attention as ta
from ddtree_jax.tuning import kernel_tuning_for, tuning_for

# device kind, platform, compute capability (None: not reported), SMs
DEVICES = {
    "H200": ("NVIDIA H200", "gpu", "9.0", 132),
    "H100": ("NVIDIA H100 80GB HBM3", "gpu", "9.0", 132),
    "H100-PCIe": ("NVIDIA H100 PCIe", "gpu", "9.0", 114),
    "A100": ("NVIDIA A100-SXM4-80GB", "gpu", "8.0", 108),
    "V100": ("Tesla V100-SXM2-16GB", "gpu", "7.0", 80),
    "CPU": ("cpu", "cpu", None, None),
}
TS = (1, 16, 65, 72, 256, 257, 264, 1024, 1025, 1032, 4096)
sds = jax.ShapeDtypeStruct


def fake_device(name: str):
    kind, platform, cc, cores = DEVICES[name]
    dev = types.SimpleNamespace(device_kind=kind, platform=platform, core_count=cores)
    if cc is not None:
        dev.compute_capability = cc
    return dev


def mgpu_spec(c) -> str:
    """An MgpuConfig as parse_config spells it."""
    return (f"{c.block_k}x{c.stages}w{c.compute_wgs}{'k' if c.split_keys else ''}{'s' if c.skip_empty else ''}"
            f"{f'c{c.key_splits}' if c.key_splits > 1 else ''}{'o' if c.overlap else ''}"
            f"{f't{c.tail_splits}' if c.tail_splits > 1 else ''}{'m' if c.merge_kernel else ''}")


def tiles(cfg, default) -> str:
    """The fields a tuned KernelConfig changes from default_config ("" for none)."""
    if cfg is None:
        return ""
    diff = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if getattr(cfg, f.name) != getattr(default, f.name)}
    return "*" + ",".join(f"{k}={v}" for k, v in sorted(diff.items())) if diff else "*"


def attention_cell(kernels, t, bt, s, dtype, hq=32, hkv=8, dh=128, window=False) -> str:
    q, kc = sds((bt, t, hq, dh), dtype), sds((bt, hkv, s, dh), dtype)
    impl, cfg = dispatch.attention_choice(kernels, q, kc, sds((bt,), jnp.int32) if window else None)
    if impl == "mosaic":
        return "mosaic:" + mgpu_spec(cfg)
    if impl == "pallas":
        item = jnp.dtype(dtype).itemsize
        return "pallas" + tiles(cfg, ta.default_config(t, hq // hkv, dh, item))
    return impl


def matmul_cells(kernels, k, n, prologue, weight) -> str:
    w = mm.Int8Weight(sds((k, n), jnp.int8), sds((n,), jnp.float32)) if weight else sds((k, n), jnp.bfloat16)
    explicit = kernels.with_impls(matmul="pallas")
    cells = []
    for m in (16, 65):
        for opts in ({}, {"xla_gpu_experimental_force_split_k": 1}):
            def plan(kt):
                impl, cfg = dispatch.matmul_choice(kt.compiled_with(opts), (m, k), w, prologue)
                return mm._plan_call((m, k), w, impl, cfg, prologue)[:2]

            (path, cfg), (e_path, e_cfg) = plan(kernels), plan(explicit)
            # the fields before row_tile (the deterministic mode's; 0 in every table entry)
            c = lambda cfg: ":" + ",".join(str(int(x)) for x in dataclasses.astuple(cfg)[:-1])  # noqa: E731
            cells.append(f"{'split1 ' if opts else ''}m={m} auto={path}{c(cfg) if path != 'xla' else ''} "
                         f"pallas={e_path}{c(e_cfg)}")
    return " | ".join(cells)


def choices(kernels) -> dict:
    """Everything the table pins, for one device's kernel tuning."""
    out = {}

    def cell(t, bt, s, dtype, hq=32, hkv=8, dh=128):
        rows = dispatch.verify_rows(kernels, t, hq, hkv, dh, dtype, cache_size=s, batch=bt)
        return f"{t}:{attention_cell(kernels, t, bt, s, dtype, hq, hkv, dh)}" + ("" if rows == t else f"->{rows}")

    for dtype, name, caches, batches in ((jnp.bfloat16, "bf16", (640, 4992, 5120), (1, 2, 4, 16)),
                                         (jnp.float32, "f32", (640, 5120), (1, 16))):
        for s in caches:
            for bt in batches:
                out[f"{name} S={s} B={bt}"] = " ".join(cell(t, bt, s, dtype) for t in TS)
    for hq, hkv, dh in ((16, 8, 64), (32, 2, 128), (16, 2, 64), (8, 8, 96)):
        out[f"bf16 S=1024 B=1 heads={hq}/{hkv}/{dh}"] = " ".join(
            cell(t, 1, 1024, jnp.bfloat16, hq, hkv, dh) for t in TS)
    mosaic = kernels.with_impls(attention="mosaic", norms="auto")

    def explicit(t, bt):
        q, kc = sds((bt, t, 32, 128), jnp.bfloat16), sds((bt, 8, 8192, 128), jnp.bfloat16)
        return f"{t}/B{bt}:{mgpu_spec(dispatch.attention_choice(mosaic, q, kc)[1])}"

    out["explicit mosaic S=8192"] = " ".join(explicit(t, bt) for t in (16, 72, 256, 264, 1024) for bt in (1, 2))
    out["bf16 S=1024 B=1 window"] = " ".join(
        f"{t}:{attention_cell(kernels, t, 1, 1024, jnp.bfloat16, window=True)}" for t in (16, 72, 264))
    out["auto"] = (f"attention={kernels.auto_attention} norms={dispatch.norm_choice(kernels, None)} "
                   f"norms_unsupported={dispatch.norm_choice(kernels, 'x')} cache={dispatch.cache_choice(kernels)} "
                   f"takes_kernels={dispatch.takes_kernels(kernels, 'attention')} "
                   f"available={','.join(dispatch.available_impls(kernels))}")
    for k, n, pro, weight in ((4096, 6144, None, None), (4096, 10240, None, None), (4096, 6144, None, "int8"),
                              (4096, 10240, None, "int8"), (4096, 6144, "rmsnorm", None), (4096, 4096, None, None)):
        out[f"matmul {k}x{n}{'/' + pro if pro else ''}{'/' + weight if weight else ''}"] = matmul_cells(
            kernels, k, n, pro, weight)
    return out


XLA_ROW = '1:xla 16:xla 65:xla 72:xla 256:xla 257:xla 264:xla 1024:xla 1025:xla 1032:xla 4096:xla'
# the Triton kernel at its default tiles, XLA for a prompt piece
TRITON_ROW = ('1:pallas 16:pallas 65:pallas 72:pallas 256:pallas 257:pallas 264:pallas 1024:pallas 1025:pallas '
              '1032:pallas 4096:xla')
# the products where no tile table entry applies: XLA's dot under auto, default tiles under pallas
UNTUNED_MATMUL = {
    'matmul 4096x6144':
        'm=16 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=16 auto=xla '
        'pallas=pallas:64,128,4,4,2,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=65 '
        'auto=xla pallas=pallas:64,128,4,4,2,1,0',
    'matmul 4096x10240':
        'm=16 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=16 auto=xla '
        'pallas=pallas:64,128,4,4,1,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=65 '
        'auto=xla pallas=pallas:64,128,4,4,1,1,0',
    'matmul 4096x6144/int8':
        'm=16 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=16 auto=xla '
        'pallas=pallas:64,128,4,4,2,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=65 '
        'auto=xla pallas=pallas:64,128,4,4,2,1,0',
    'matmul 4096x10240/int8':
        'm=16 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=16 auto=xla '
        'pallas=pallas:64,128,4,4,1,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=65 '
        'auto=xla pallas=pallas:64,128,4,4,1,1,0',
    'matmul 4096x6144/rmsnorm':
        'm=16 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=16 auto=xla '
        'pallas=pallas:64,128,4,4,1,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=65 '
        'auto=xla pallas=pallas:64,128,4,4,1,1,0',
    'matmul 4096x4096':
        'm=16 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=16 auto=xla '
        'pallas=pallas:64,128,4,4,2,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=65 '
        'auto=xla pallas=pallas:64,128,4,4,2,1,0',
}
GOLDEN = {
    'H200': {
        'bf16 S=640 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas*block_k=64,block_m=64,block_new=64,num_splits=1,num_warps=4,skip_empty=True->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so '
            '1025:pallas*block_k=64,block_m=64,num_warps=4,skip_empty=True->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=640 B=2':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so '
            '257:pallas*block_k=64,block_m=64,block_new=64,num_splits=1,num_warps=4,skip_empty=True->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so '
            '1025:pallas*block_k=64,block_m=64,num_warps=4,skip_empty=True->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=640 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so '
            '257:pallas*block_k=64,block_m=64,block_new=64,num_splits=1,num_warps=4,skip_empty=True->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so '
            '1025:pallas*block_k=64,block_m=64,num_warps=4,skip_empty=True->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=640 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so '
            '257:pallas*block_k=64,block_m=64,block_new=64,num_splits=1,num_warps=4,skip_empty=True->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so '
            '1025:pallas*block_k=64,block_m=64,num_warps=4,skip_empty=True->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=4992 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=4992 B=2':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x4w2kst8 1024:mosaic:64x3w2so 1025:pallas->1032 '
            '1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=2':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x3w2so '
            '257:pallas->264 264:mosaic:64x3w2sot8 1024:mosaic:64x3w2so 1025:pallas->1032 '
            '1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'f32 S=640 B=1':
            TRITON_ROW,
        'f32 S=640 B=16':
            TRITON_ROW,
        'f32 S=5120 B=1':
            TRITON_ROW,
        'f32 S=5120 B=16':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/8/64':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=1024 B=1 heads=32/2/128':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/2/64':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=1024 B=1 heads=8/8/96':
            XLA_ROW,
        'explicit mosaic S=8192':
            '16/B1:64x4w2kc8m 16/B2:64x4w2kc8m 72/B1:64x4w2kc3m 72/B2:64x4w2kc3m 256/B1:64x4w2ks '
            '256/B2:64x3w2so 264/B1:64x4w2kst8 264/B2:64x3w2sot8 1024/B1:64x3w2so 1024/B2:64x3w2so',
        'bf16 S=1024 B=1 window':
            '16:pallas 72:pallas 264:pallas',
        'auto':
            'attention=pallas norms=pallas norms_unsupported=xla cache=pallas takes_kernels=True '
            'available=auto,pallas,triton,xla,pallas_interpret',
        'matmul 4096x6144':
            'm=16 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=16 auto=pallas:64,128,4,4,2,1,0 '
            'pallas=pallas:64,128,4,4,2,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=65 '
            'auto=xla pallas=pallas:64,128,4,4,2,1,0',
        'matmul 4096x10240':
            'm=16 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=16 auto=pallas:64,128,4,4,1,1,0 '
            'pallas=pallas:64,128,4,4,1,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=65 '
            'auto=xla pallas=pallas:64,128,4,4,1,1,0',
        'matmul 4096x6144/int8':
            'm=16 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=16 auto=pallas:64,128,4,4,1,1,0 '
            'pallas=pallas:64,128,4,4,1,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=65 '
            'auto=xla pallas=pallas:64,128,4,4,2,1,0',
        'matmul 4096x10240/int8':
            'm=16 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=16 auto=pallas:64,128,4,4,2,1,0 '
            'pallas=pallas:64,128,4,4,2,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=65 '
            'auto=xla pallas=pallas:64,128,4,4,1,1,0',
        'matmul 4096x6144/rmsnorm':
            'm=16 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=16 auto=xla '
            'pallas=pallas:64,128,4,4,1,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,1,1,0 | split1 m=65 '
            'auto=xla pallas=pallas:64,128,4,4,1,1,0',
        'matmul 4096x4096':
            'm=16 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=16 auto=xla '
            'pallas=pallas:64,128,4,4,2,1,0 | m=65 auto=xla pallas=pallas:64,128,4,4,2,1,0 | split1 m=65 '
            'auto=xla pallas=pallas:64,128,4,4,2,1,0',
    },
    'H100': {
        'bf16 S=640 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=640 B=2':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=640 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=640 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=4992 B=2':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x4w2kst8 1024:mosaic:64x3w2so 1025:pallas->1032 '
            '1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=2':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x3w2so '
            '257:pallas->264 264:mosaic:64x3w2sot8 1024:mosaic:64x3w2so 1025:pallas->1032 '
            '1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'f32 S=640 B=1':
            TRITON_ROW,
        'f32 S=640 B=16':
            TRITON_ROW,
        'f32 S=5120 B=1':
            TRITON_ROW,
        'f32 S=5120 B=16':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/8/64':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=1024 B=1 heads=32/2/128':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/2/64':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=1024 B=1 heads=8/8/96':
            XLA_ROW,
        'explicit mosaic S=8192':
            '16/B1:64x4w2kc8m 16/B2:64x4w2kc8m 72/B1:64x4w2kc3m 72/B2:64x4w2kc3m 256/B1:64x4w2ks '
            '256/B2:64x3w2so 264/B1:64x4w2kst8 264/B2:64x3w2sot8 1024/B1:64x3w2so 1024/B2:64x3w2so',
        'bf16 S=1024 B=1 window':
            '16:pallas 72:pallas 264:pallas',
        'auto':
            'attention=pallas norms=pallas norms_unsupported=xla cache=pallas takes_kernels=True '
            'available=auto,pallas,triton,xla,pallas_interpret',
        **UNTUNED_MATMUL,
    },
    'H100-PCIe': {
        'bf16 S=640 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=640 B=2':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=640 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=640 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 '
            '264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=2':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=4992 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=1':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 '
            '264:mosaic:64x3w2sot8 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=2':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=4':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'bf16 S=5120 B=16':
            '1:pallas 16:pallas 65:pallas 72:pallas 256:mosaic:64x3w2so 257:pallas->264 264:mosaic:64x3w2so '
            '1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so 4096:xla',
        'f32 S=640 B=1':
            TRITON_ROW,
        'f32 S=640 B=16':
            TRITON_ROW,
        'f32 S=5120 B=1':
            TRITON_ROW,
        'f32 S=5120 B=16':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/8/64':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=1024 B=1 heads=32/2/128':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/2/64':
            '1:pallas 16:mosaic:64x4w2kc8m 65:pallas->72 72:mosaic:64x4w2kc3m 256:mosaic:64x4w2ks '
            '257:pallas->264 264:mosaic:64x3w2so 1024:mosaic:64x3w2so 1025:pallas->1032 1032:mosaic:64x3w2so '
            '4096:xla',
        'bf16 S=1024 B=1 heads=8/8/96':
            XLA_ROW,
        'explicit mosaic S=8192':
            '16/B1:64x4w2kc8m 16/B2:64x3w2so 72/B1:64x4w2k 72/B2:64x4w2k 256/B1:64x3w2so 256/B2:64x3w2so '
            '264/B1:64x3w2sot8 264/B2:64x3w2so 1024/B1:64x3w2so 1024/B2:64x3w2so',
        'bf16 S=1024 B=1 window':
            '16:pallas 72:pallas 264:pallas',
        'auto':
            'attention=pallas norms=pallas norms_unsupported=xla cache=pallas takes_kernels=True '
            'available=auto,pallas,triton,xla,pallas_interpret',
        **UNTUNED_MATMUL,
    },
    'A100': {
        'bf16 S=640 B=1':
            TRITON_ROW,
        'bf16 S=640 B=2':
            TRITON_ROW,
        'bf16 S=640 B=4':
            TRITON_ROW,
        'bf16 S=640 B=16':
            TRITON_ROW,
        'bf16 S=4992 B=1':
            TRITON_ROW,
        'bf16 S=4992 B=2':
            TRITON_ROW,
        'bf16 S=4992 B=4':
            TRITON_ROW,
        'bf16 S=4992 B=16':
            TRITON_ROW,
        'bf16 S=5120 B=1':
            TRITON_ROW,
        'bf16 S=5120 B=2':
            TRITON_ROW,
        'bf16 S=5120 B=4':
            TRITON_ROW,
        'bf16 S=5120 B=16':
            TRITON_ROW,
        'f32 S=640 B=1':
            TRITON_ROW,
        'f32 S=640 B=16':
            TRITON_ROW,
        'f32 S=5120 B=1':
            TRITON_ROW,
        'f32 S=5120 B=16':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/8/64':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=32/2/128':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=16/2/64':
            TRITON_ROW,
        'bf16 S=1024 B=1 heads=8/8/96':
            XLA_ROW,
        'explicit mosaic S=8192':
            '16/B1:64x4w2kc8m 16/B2:64x3w2so 72/B1:64x4w2k 72/B2:64x4w2k 256/B1:64x3w2so 256/B2:64x3w2so '
            '264/B1:64x3w2sot8 264/B2:64x3w2so 1024/B1:64x3w2so 1024/B2:64x3w2so',
        'bf16 S=1024 B=1 window':
            '16:pallas 72:pallas 264:pallas',
        'auto':
            'attention=pallas norms=pallas norms_unsupported=xla cache=pallas takes_kernels=True '
            'available=auto,pallas,triton,xla,pallas_interpret',
        **UNTUNED_MATMUL,
    },
    'V100': {
        'bf16 S=640 B=1':
            XLA_ROW,
        'bf16 S=640 B=2':
            XLA_ROW,
        'bf16 S=640 B=4':
            XLA_ROW,
        'bf16 S=640 B=16':
            XLA_ROW,
        'bf16 S=4992 B=1':
            XLA_ROW,
        'bf16 S=4992 B=2':
            XLA_ROW,
        'bf16 S=4992 B=4':
            XLA_ROW,
        'bf16 S=4992 B=16':
            XLA_ROW,
        'bf16 S=5120 B=1':
            XLA_ROW,
        'bf16 S=5120 B=2':
            XLA_ROW,
        'bf16 S=5120 B=4':
            XLA_ROW,
        'bf16 S=5120 B=16':
            XLA_ROW,
        'f32 S=640 B=1':
            XLA_ROW,
        'f32 S=640 B=16':
            XLA_ROW,
        'f32 S=5120 B=1':
            XLA_ROW,
        'f32 S=5120 B=16':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=16/8/64':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=32/2/128':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=16/2/64':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=8/8/96':
            XLA_ROW,
        'explicit mosaic S=8192':
            '16/B1:64x4w2kc8m 16/B2:64x3w2so 72/B1:64x4w2kc3m 72/B2:64x4w2k 256/B1:64x3w2so 256/B2:64x3w2so '
            '264/B1:64x3w2sot8 264/B2:64x3w2so 1024/B1:64x3w2so 1024/B2:64x3w2so',
        'bf16 S=1024 B=1 window':
            '16:xla 72:xla 264:xla',
        'auto':
            'attention=xla norms=xla norms_unsupported=xla cache=xla takes_kernels=False '
            'available=auto,xla,pallas_interpret',
        **UNTUNED_MATMUL,
    },
    'CPU': {
        'bf16 S=640 B=1':
            XLA_ROW,
        'bf16 S=640 B=2':
            XLA_ROW,
        'bf16 S=640 B=4':
            XLA_ROW,
        'bf16 S=640 B=16':
            XLA_ROW,
        'bf16 S=4992 B=1':
            XLA_ROW,
        'bf16 S=4992 B=2':
            XLA_ROW,
        'bf16 S=4992 B=4':
            XLA_ROW,
        'bf16 S=4992 B=16':
            XLA_ROW,
        'bf16 S=5120 B=1':
            XLA_ROW,
        'bf16 S=5120 B=2':
            XLA_ROW,
        'bf16 S=5120 B=4':
            XLA_ROW,
        'bf16 S=5120 B=16':
            XLA_ROW,
        'f32 S=640 B=1':
            XLA_ROW,
        'f32 S=640 B=16':
            XLA_ROW,
        'f32 S=5120 B=1':
            XLA_ROW,
        'f32 S=5120 B=16':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=16/8/64':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=32/2/128':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=16/2/64':
            XLA_ROW,
        'bf16 S=1024 B=1 heads=8/8/96':
            XLA_ROW,
        'explicit mosaic S=8192':
            '16/B1:64x4w2kc8m 16/B2:64x4w2kc8m 72/B1:64x4w2kc3m 72/B2:64x4w2kc3m 256/B1:64x4w2ks '
            '256/B2:64x4w2ks 264/B1:64x3w2so 264/B2:64x3w2so 1024/B1:64x3w2so 1024/B2:64x3w2so',
        'bf16 S=1024 B=1 window':
            '16:xla 72:xla 264:xla',
        'auto':
            'attention=xla norms=xla norms_unsupported=xla cache=xla takes_kernels=False '
            'available=auto,xla,pallas_interpret',
        **UNTUNED_MATMUL,
    },
}


@pytest.mark.parametrize("device", list(DEVICES))
def test_choices_are_the_recorded_ones(device):
    got = choices(tuning_for(fake_device(device)).kernels)
    want = GOLDEN[device]
    assert list(got) == list(want)
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    assert not wrong, "\n".join(f"{k}:\n  got  {g}\n  want {w}" for k, (g, w) in wrong.items())


def test_the_named_tunings_are_what_tuning_for_chooses():
    """tuning.H100 / H200 / CPU are the tunings tuning_for picks for those devices (the GPUs as
    jax reports them: kind, compute capability 9.0, 132 SMs), and every other device gets one
    built from its kind, platform, compute capability and SM count."""
    assert tuning_for(fake_device("H200")) == tuning.H200
    assert tuning_for(fake_device("H100")) == tuning.H100
    assert tuning_for(fake_device("CPU")) == tuning.CPU
    a100 = tuning_for(fake_device("A100"))
    assert a100.tree == tuning.GPU_TREE and a100.round_xla_options == ()
    assert a100.kernels == dataclasses.replace(tuning.GPU_KERNELS, tile_table="NVIDIA A100-SXM4-80GB", sm_count=108)
    assert tuning_for(fake_device("H100-PCIe")).kernels.sm_count == 114
    # a GPU without a compute capability goes by its kind; other platforms get XLA
    no_cc = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")
    assert kernel_tuning_for(no_cc).auto_attention == "pallas" and kernel_tuning_for(no_cc).mosaic_t_range is None
    for kind, platform in (("Tesla V100-SXM2-16GB", "gpu"), ("AMD Instinct MI300X", "gpu"), ("TPU v5 lite", "tpu")):
        k = kernel_tuning_for(types.SimpleNamespace(platform=platform, device_kind=kind))
        assert dataclasses.replace(k, tile_table=None) == tuning.CPU_KERNELS
    if jax.devices()[0].platform == "cpu":
        assert tuning_for(jax.devices()[0]) == tuning.CPU


def test_user_impls_fold_into_the_tuning():
    """--attn-impl / --matmul-impl / --cache-impl replace "auto" (the norms follow the attention
    unless given); unknown names fail when the tuning is built, with the names to choose from."""
    h200 = tuning.H200.kernels
    k = h200.with_impls(attention="triton", matmul="xla")
    assert (k.attention, k.norm_impl, k.matmul, k.cache) == ("triton", "pallas", "xla", "auto")
    assert dispatch.verify_rows(k, 257, 32, 8, 128, jnp.bfloat16, cache_size=640) == 257   # no Mosaic GPU padding
    assert not dispatch.takes_kernels(k, "matmul") and dispatch.takes_kernels(k, "cache")
    assert not dispatch.takes_kernels(tuning.CPU_KERNELS, "norms")
    assert dispatch.takes_kernels(tuning.CPU_KERNELS.with_impls(norms="pallas_interpret"), "norms")
    assert k.compiled_with({"b": 1}).compiled_with({"a": 2, "b": 3}).xla_options == (("a", 2), ("b", 3))
    assert k.compiled_with(None) is k
    with pytest.raises(ValueError, match="unknown attention impl 'cuda'"):
        h200.with_impls(attention="cuda")
    with pytest.raises(ValueError, match="unknown matmul impl 'mosaic'"):
        h200.with_impls(matmul="mosaic")
    with pytest.raises(ValueError, match="give norms="):
        h200.with_impls(attention="mosaic")
    with pytest.raises(ValueError, match="auto_matmul"):
        dataclasses.replace(h200, auto_matmul="triton")
    with pytest.raises(ValueError, match="unknown kernel family"):
        dispatch.takes_kernels(h200, "softmax")


def test_the_generator_folds_the_flags_into_its_tuning():
    """Generator(attn_impl=, matmul_impl=, cache_impl=) land in its tuning's kernels, which every
    spec it makes carries; "auto" keeps what a given tuning says; a name this device cannot run
    is a one-line error."""
    from ddtree_jax.errors import UserError
    from ddtree_jax.generator import Generator
    from ddtree_jax.sampling import SamplingConfig
    from tiny import tiny_pair

    pair = tiny_pair()
    gen = Generator(pair, method="ar", attn_impl="xla", matmul_impl="pallas_interpret")
    assert (gen.tuning.kernels.attention, gen.tuning.kernels.matmul, gen.tuning.kernels.cache) == (
        "xla", "pallas_interpret", "auto")
    assert gen.spec_for(8, 8, SamplingConfig()).tuning.kernels == gen.tuning.kernels
    given = dataclasses.replace(tuning.CPU, kernels=tuning.CPU_KERNELS.with_impls(cache="xla"))
    assert Generator(pair, method="ar", tuning=given).tuning.kernels.cache == "xla"
    with pytest.raises(UserError, match="available here: auto, xla, pallas_interpret"):
        Generator(pair, method="ar", attn_impl="pallas")
