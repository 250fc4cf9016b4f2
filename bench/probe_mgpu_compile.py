"""Compile time of the Mosaic GPU attention kernel against the Triton one: one jit holding n calls
(as a forward's layers hold one each), for n = 1, 4, 16; seconds to lower and to compile.

    python -m bench.probe_mgpu_compile --ns 1,4,16
"""
from __future__ import annotations

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp

from bench.bench_kernels import int_list, make_case
from ddtree_jax.kernels import attention
from ddtree_jax.kernels.tree_attention_mgpu import attention_mgpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.probe_mgpu_compile", description=__doc__.splitlines()[0])
    ap.add_argument("--ns", default="1,4,16", type=int_list)
    ap.add_argument("--t", type=int, default=264)
    args = ap.parse_args(argv)
    case = make_case(jax.random.key(0), bt=1, t=args.t, s=1024, hq=32, hkv=8, dh=128, dtype=jnp.bfloat16,
                     cache_len=[512])
    fns = {"triton": functools.partial(attention, scale=0.088, impl="pallas"),
           "mosaic": functools.partial(attention_mgpu, scale=0.088)}               # one jitted callee
    for n in args.ns:
        for name, fn in fns.items():
            def chain(q, *rest, fn=fn):
                for _ in range(n):
                    q = fn(q, *rest)
                return q
            t0 = time.perf_counter()
            lowered = jax.jit(chain).trace(*case).lower()
            t1 = time.perf_counter()
            lowered.compile()
            t2 = time.perf_counter()
            print(f"{name:14s} n={n:3d} lower {t1 - t0:6.2f} s  compile {t2 - t1:6.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
