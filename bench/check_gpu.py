"""On-device parity of the compiled Pallas paths with the XLA reference, through the whole target.

    python3 -m bench.check_gpu                 # on the GPU: Pallas (compiled) vs XLA
    python3 -m bench.check_gpu --impl auto     # what the engine runs (the Mosaic GPU kernel at 264)
    python3 -m bench.check_gpu --impl pallas_interpret --layers 1 --small   # CPU smoke run
    python3 -m bench.check_gpu --impl mosaic_interpret --layers 1 --small   # the Mosaic GPU kernel, CPU

The CPU tests run the Pallas kernels in interpret mode only; this runs the compiled kernels where
they will run (attention, fused norms, whatever the attention impl switches) inside `target.forward`
on a few layers of the Qwen3-8B shape in bf16, with norm weights that are not all ones, for
tree sizes T = 1, 16, 65, 257, 264, 1032 over committed prefixes (--small: 1, 5, 16), and
compares final hidden states, tapped states and the new K/V with the attention on XLA. Exits non-zero
on a NaN or an error above --tol.
"""
from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.models import target
from ddtree_jax.models.config import RopeConfig, TargetConfig
from ddtree_jax.models.init import init_target
from ddtree_jax.models.layers import KVCache, append
from ddtree_jax.kernels.tree_attention_mgpu import prepare_cpu_for_interpret
from ddtree_jax.tuning import tuning_for


def perturb_norms(params: dict, key) -> dict:
    """Norm weights 1 + 0.2 N(0, 1): a kernel that dropped or misplaced them would show."""
    def one(path, x):
        name = jax.tree_util.keystr(path)
        if "norm" in name:
            k = jax.random.fold_in(key, hash(name) % (2**31))
            return (1.0 + 0.2 * jax.random.normal(k, x.shape, jnp.float32)).astype(x.dtype)
        return x
    return jax.tree_util.tree_map_with_path(one, params)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-6))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.check_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="pallas")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="small shapes (CPU smoke run)")
    ap.add_argument("--tol", type=float, default=3e-2, help="max |a-b| / max |b| allowed (bf16)")
    args = ap.parse_args(argv)
    if args.impl.endswith("_interpret"):
        prepare_cpu_for_interpret()  # before the first computation starts jax's CPU backend
    if args.small:
        dims = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_heads=2, num_kv_heads=1, head_dim=64)
        cases = [(1, 0), (5, 21), (16, 21)]
    else:
        dims = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_heads=32, num_kv_heads=8,
                    head_dim=128)
        # T = 264 / 1032: DDTree-256 / -1024 verifies padded to 8 rows, which "auto" gives the Mosaic
        # GPU kernel on Hopper (ddtree_jax/kernels/tree_attention_mgpu.py); --impl auto checks that path
        # T = 16 over 5 keys: the drafter's block on a short prompt, where 7 of the Mosaic GPU
        # kernel's 8 key shares (its T = 16 default) see no key
        cases = [(1, 0), (1, 600), (1, 8192), (16, 5), (16, 600), (65, 600), (65, 8192), (257, 1000), (264, 1000),
                 (264, 4001), (1032, 600)]
    cfg = TargetConfig(family="qwen3", rms_eps=1e-6, qk_norm=True, qkv_bias=False, rope=RopeConfig(theta=1e6),
                       num_layers=args.layers, max_position=40960, tie_embeddings=False, **dims)
    dtype = jnp.bfloat16
    params = target.fuse_params(perturb_norms(init_target(cfg, jax.random.key(0), dtype), jax.random.key(1)))
    taps = tuple(range(args.layers))
    worst = 0.0
    rng = np.random.default_rng(0)
    # the Mosaic GPU kernel takes T % 8 == 0 only (the engine pads); its norms are "auto"'s
    mosaic = args.impl.startswith("mosaic")
    here = tuning_for().kernels         # this device's choices; the checked impl and XLA's replace "auto"
    kernels = {impl: here.with_impls(attention=impl, norms="auto" if impl.startswith("mosaic") else None)
               for impl in (args.impl, "xla")}
    for t, prefix in cases:
        if mosaic and t % 8:
            print(f"[check_gpu] T={t:4d} prefix={prefix:5d} skipped: {args.impl} needs T % 8 == 0", flush=True)
            continue
        size = -(-(prefix + t + 64) // 128) * 128      # the engine's caches: multiples of 128
        cache = KVCache.zeros(cfg.num_layers, 1, cfg.num_kv_heads, size, cfg.head_dim, dtype)
        if prefix:
            toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, prefix)), jnp.int32)
            pos = jnp.arange(prefix, dtype=jnp.int32)[None]
            _, _, (k, v) = jax.jit(target.forward, static_argnames=("cfg", "kernels"))(
                params, cfg, toks, pos, None, None, target.causal_mask(1, prefix), kernels=kernels["xla"])
            cache = append(cache, k, v, jnp.zeros((1,), jnp.int32))
        # a random tree: node i's parent is a random earlier node (root 0)
        parents = [-1] + [int(rng.integers(0, i)) for i in range(1, t)]
        mask = np.eye(t, dtype=bool)
        for i in range(1, t):
            mask[i] |= mask[parents[i]]
        depth = mask.sum(1) - 1
        toks = jnp.asarray(rng.integers(0, cfg.vocab_size, (1, t)), jnp.int32)
        pos = jnp.asarray(prefix + depth, jnp.int32)[None]
        outs = {}
        for impl in (args.impl, "xla"):
            fwd = jax.jit(target.forward, static_argnames=("cfg", "taps", "kernels"))
            outs[impl] = jax.block_until_ready(fwd(params, cfg, toks, pos, cache, jnp.asarray([prefix], jnp.int32),
                                                   jnp.asarray(mask)[None], taps=taps, kernels=kernels[impl]))
        (h, tap, (k, v)), (h0, tap0, (k0, v0)) = outs[args.impl], outs["xla"]
        errs = dict(hidden=rel_err(h, h0), taps=rel_err(tap, tap0), k=max(rel_err(a, b) for a, b in zip(k, k0)),
                    v=max(rel_err(a, b) for a, b in zip(v, v0)))
        nan = any(bool(jnp.isnan(x).any()) for x in (h, tap, *k, *v))
        worst = max(worst, *errs.values(), float("inf") if nan else 0.0)
        print(f"[check_gpu] T={t:4d} prefix={prefix:5d} {args.impl} vs xla: "
              + " ".join(f"{k}={e:.2e}" for k, e in errs.items()) + (" NaN!" if nan else ""), flush=True)
    ok = worst <= args.tol
    print(f"[check_gpu] {jax.devices()[0].device_kind}: worst {worst:.2e} ({'ok' if ok else 'FAIL'}, tol {args.tol})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
