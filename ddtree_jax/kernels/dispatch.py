"""Which kernel runs each of the model's calls, with which config: the one place that decides.

The models call the functions at the bottom (`attention`, `rms_norm`, `add_rms_norm`,
`qk_norm_rope`, `matmul`, `write_cache_rows`) with a `KernelTuning` (ddtree_jax.tuning: this
device's choices and the user's impls) and the call's arrays. Each resolves the impl ("auto" to
this device's choice for these shapes) and the config (the tile tables, the Mosaic GPU kernel's
fitted configs), then calls the kernel module with them explicitly. The kernel modules read no
device and no tuning: everything they need comes in as arguments. All choices are static (from
shapes and the frozen KernelTuning), so they are made at trace time and cost nothing at run time.

`verify_rows` is the engine's side of the same choice: how many rows a verify pass should have
so that "auto" can take the Mosaic GPU kernel (whose TMA boxes need T % 8 == 0).

The deterministic mode (KernelTuning.deterministic) decides nothing by shape: every product runs
the skinny-matmul kernel with `matmul.deterministic_config` (fixed row tile, K step and split
count, the parts summed in one order), the attention `deterministic_attention.py`, a Gated
DeltaNet layer's recurrence `gdn_recurrence.py` (node by node: a step is a one-node tree), the
norms their kernels with a row block that does not follow the row count, so that a row's output is
the same bits in a pass of any size; a shape one of them cannot take is an error, never a silent
XLA fallback.

Under --tp (`KernelTuning.mesh`, ddtree_jax/sharding.py) GSPMD partitions the XLA calls, and a
Pallas call, which it cannot partition, runs per shard inside `jax.shard_map`: the attention over
its device's heads (q by heads, the caches by kv heads, lengths and masks replicated), the Gated
DeltaNet recurrence over its key and value heads, the norms over the replicated hidden state on
every device. Each shard's impl and config are chosen from its own shapes. The products and cache
writes stay XLA's (`matmul_choice`, `cache_choice`).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from ddtree_jax.tuning import KernelTuning

from . import cache_write as cw
from . import deterministic_attention as det
from . import gdn_recurrence as gdn_rec
from . import matmul as mm
from . import norms
from . import tree_attention as ta
from . import tree_attention_mgpu as mgpu
from .attention_reference import attention_reference, check_attention_shapes
from .stacking import split_row

__all__ = ["attention_choice", "mosaic_config", "verify_rows", "norm_choice", "matmul_choice", "matmul_path",
           "cache_choice", "moe_choice", "takes_kernels", "shards", "available_impls", "attention", "rms_norm",
           "add_rms_norm", "qk_norm_rope", "matmul", "write_cache_rows", "expert_rows", "expert_matmul", "row_sum",
           "gdn_recurrence"]

FAMILIES = ("attention", "norms", "matmul", "cache")


# ----------------------------------------------------------------------------- choices

def takes_kernels(kernels: KernelTuning, family: str) -> bool:
    """Whether `family`'s calls ("attention", "norms", "matmul", "cache") run Pallas kernels
    where their shapes allow: every impl but "xla", and "auto" where this device's choice is
    "pallas". Shape-free: a caller that lays out data for the kernels (stacked norm weights)
    asks this once, before any call's shapes are known."""
    if family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r}; choose one of {', '.join(FAMILIES)}")
    impl = kernels.norm_impl if family == "norms" else getattr(kernels, family)
    if kernels.mesh is not None and family in ("matmul", "cache") and impl == "auto":
        return False    # auto is XLA's under --tp (matmul_choice, cache_choice)
    return impl != "xla" and (impl != "auto" or getattr(kernels, f"auto_{family}") == "pallas")


def available_impls(kernels: KernelTuning) -> tuple[str, ...]:
    """Attention impl names a user may pick on this device ("mosaic" is per call, not engine-wide)."""
    names = ["auto", "xla", "pallas_interpret"]
    if kernels.auto_attention == "pallas":
        names[1:1] = ["pallas", "triton"]
    return tuple(names)


def _grid(q, k_layer) -> tuple[int, int, int]:
    """(Bt, Hkv, G) of q [Bt, T, Hq, Dh] over one layer's k [Bt, Hkv, S, Dh]."""
    bt, _, hq, _ = q.shape
    hkv = k_layer.shape[1]
    return bt, hkv, hq // hkv


def _mosaic_fitted(kernels: KernelTuning, q, k_layer):
    return mgpu.fitted_config(q.shape[1], _grid(q, k_layer), kernels.sm_count, k_layer.shape[2],
                              long_cache_from=kernels.mosaic_long_cache_from)


def _mosaic_any(kernels: KernelTuning, q, k_layer):
    """The Mosaic GPU kernel's config for these inputs whatever the T range (mgpu.config_for)."""
    return mgpu.config_for(q.shape[1], _grid(q, k_layer), kernels.sm_count, k_layer.shape[2],
                           long_cache_from=kernels.mosaic_long_cache_from)


def mosaic_config(kernels: KernelTuning, q, k_layer, kv_start=None):
    """The config "auto" runs the Mosaic GPU kernel with for q [Bt, T, Hq, Dh] over one layer's
    k [Bt, Hkv, S, Dh] (shapes or ShapeDtypeStructs), or None where it should not run it: no
    Mosaic GPU kernel on this device, T outside `mosaic_t_range` with no one-wave or long-cache
    config fitting the grid, or inputs the kernel cannot take."""
    if kernels.mosaic_t_range is None:
        return None
    lo, hi = kernels.mosaic_t_range
    if not lo <= q.shape[1] <= hi and _mosaic_fitted(kernels, q, k_layer) is None:
        return None
    cfg = _mosaic_any(kernels, q, k_layer)
    return None if mgpu.mgpu_unsupported(q, k_layer, kv_start, cfg) else cfg


def attention_choice(kernels: KernelTuning, q, k_layer, kv_start=None, k_cache=None):
    """(impl, config) the attention runs for q [Bt, T, Hq, Dh] over one layer's k [Bt, Hkv, S, Dh]
    (shapes or ShapeDtypeStructs; k_cache: the cache as passed, every layer's stacked, for the
    kernel's size limits, default k_layer). impl: "xla", "pallas", "triton", "pallas_interpret",
    "mosaic" or "mosaic_interpret", "deterministic" or "deterministic_interpret" (the
    deterministic mode); config: the Mosaic GPU kernel's MgpuConfig, the Triton kernel's tuned
    KernelConfig (None: its default_config), the DeterministicConfig, or None."""
    k_cache = k_layer if k_cache is None else k_cache
    impl = kernels.attention
    if kernels.deterministic:
        return ("deterministic_interpret" if impl == "pallas_interpret" else "deterministic"), det.DeterministicConfig()
    if impl == "auto":
        impl = kernels.auto_attention
        if impl == "pallas":
            cfg = mosaic_config(kernels, q, k_layer, kv_start)
            if cfg is not None:
                return "mosaic", cfg
            if ta.unsupported(q, k_cache) or q.shape[1] > kernels.max_new_tokens:
                return "xla", None
    if impl in ("mosaic", "mosaic_interpret"):
        return impl, _mosaic_any(kernels, q, k_layer)
    if impl in ("pallas", "triton"):
        return impl, ta.tuned_attention_config(q.shape[1], _grid(q, k_layer)[2], q.shape[3],
                                               jnp.dtype(q.dtype).itemsize, kernels.tile_table, s=k_layer.shape[2])
    return impl, None


def verify_rows(kernels: KernelTuning, t: int, q_heads: int, kv_heads: int, head_dim: int, dtype, *,
                cache_size: int = 8, batch: int = 1) -> int:
    """How many rows a verify pass of T tree tokens should run over a cache of `cache_size`
    positions at `batch` rows: T, or T rounded up to 8 where that lets "auto" take the Mosaic GPU
    kernel, whose TMA boxes need T % 8 == 0 (the engine pads the tree with rows that see only
    themselves). "mosaic" is not an engine-wide impl (the drafter's windows and decode are not
    its shapes): "auto" picks it per call."""
    if kernels.attention != "auto" or kernels.auto_attention != "pallas":
        return t
    rows = -(-t // 8) * 8
    n = shards(kernels)     # under --tp a device's heads choose its kernel
    q = jax.ShapeDtypeStruct((batch, rows, q_heads // n, head_dim), dtype)
    kc = jax.ShapeDtypeStruct((batch, kv_heads // n, cache_size, head_dim), dtype)
    return t if mosaic_config(kernels, q, kc) is None else rows


def norm_choice(kernels: KernelTuning, why_not: str | None) -> str:
    """The norm kernels' impl for a call the kernels cannot take for reason `why_not` (None: they
    can): "auto" falls back to XLA there; an explicit impl stays (the kernel module raises)."""
    impl = kernels.norm_impl
    if impl == "auto":
        return "pallas" if kernels.auto_norms == "pallas" and not why_not else "xla"
    return impl


def matmul_choice(kernels: KernelTuning, x_shape, w, prologue: str | None = None):
    """(impl, config) of a product x [..., K] @ w [K, N] (with that prologue): "auto" takes the
    kernel only where the tile table measured it faster (for this device kind, these rows, under
    the executable's XLA options), else XLA; an explicit "pallas" takes the table's config where
    there is one (None: the kernel's default)."""
    impl = kernels.matmul
    if kernels.mesh is not None:
        _per_shard_refused(impl, "matmul", "a row-parallel product's residual add belongs after its all-reduce")
        return "xla", None
    if kernels.deterministic:
        return impl, mm.deterministic_config(*w.shape)
    if impl == "auto" and kernels.auto_matmul != "pallas":
        return "xla", None
    if impl not in ("auto", "pallas", "triton"):
        return impl, None
    k, n = w.shape
    weight = "int8" if isinstance(w, mm.Int8Weight) else None
    tuned = mm.tuned_config(math.prod(x_shape[:-1]), k, n, kernels.tile_table, prologue, weight,
                            xla_options=dict(kernels.xla_options))
    if impl == "auto":
        return ("xla", None) if tuned is None else ("pallas", tuned)
    return impl, tuned


def fuses_prologues(kernels: KernelTuning) -> bool:
    """Whether the models fuse norms and silu * up into the products (`matmul`'s prologues). Not in
    the deterministic mode: its product holds the rows on the MMA's second operand (swap_ab), so a
    prologue's tiles go through shared memory, and at a 65-row verify those products ran at 35-40
    TFLOP/s against the plain product's 130 (8B shape, H200)."""
    return not kernels.deterministic


def matmul_path(kernels: KernelTuning, x_shape, w, prologue: str | None = None) -> str:
    """"xla", "pallas" or "pallas_interpret": the path `matmul` takes for these arguments (the
    models fuse norms and residual adds into the product only where it is the kernel's)."""
    path = mm.kernel_path(x_shape, w, *matmul_choice(kernels, x_shape, w, prologue), prologue=prologue)
    if kernels.deterministic and path == "xla":
        raise ValueError(f"the deterministic mode's matmul kernel cannot take [..., {x_shape[-1]}] @ "
                         f"{list(w.shape)}: K must be a multiple of 16; run without the deterministic mode")
    return path


def moe_choice(kernels: KernelTuning, tokens: int) -> str:
    """How an MoE block over `tokens` tokens runs its experts (models.moe.experts): "gather" up to
    the tuning's moe_gather_max tokens, else its moe_experts ("dense", "ragged", "grouped"); in the
    deterministic mode "deterministic" (the experts through the deterministic product)."""
    if kernels.deterministic:
        return "deterministic"
    return "gather" if tokens <= kernels.moe_gather_max else kernels.moe_experts


def cache_choice(kernels: KernelTuning) -> str:
    """The commit's cache-write impl: "auto" is this device's choice (XLA's under --tp)."""
    if kernels.mesh is not None:
        _per_shard_refused(kernels.cache, "cache", "the cache-write kernel does not run per shard")
        return "xla"
    return kernels.auto_cache if kernels.cache == "auto" else kernels.cache


# ----------------------------------------------------------------------------- calls

def attention(kernels: KernelTuning, q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
              kv_start=None, layer=None):
    """ddtree_jax.kernels.tree_attention.attention's contract, the impl and config chosen by
    `attention_choice` (over one layer's view of a stacked cache); under --tp a Pallas impl runs
    per shard (`_attention_per_shard`)."""
    check_attention_shapes(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer)
    if kernels.mesh is not None:
        return _attention_per_shard(kernels, q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                                    kv_start=kv_start, layer=layer)
    k_layer = k_cache if layer is None else jax.ShapeDtypeStruct(k_cache.shape[1:], k_cache.dtype)
    impl, config = attention_choice(kernels, q, k_layer, kv_start, k_cache)
    if impl.startswith("deterministic"):
        return det.deterministic_attention(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                                           kv_start=kv_start, layer=layer, config=config,
                                           interpret=impl == "deterministic_interpret")
    if impl == "xla":
        return attention_reference(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask,
                                   scale=scale, kv_start=kv_start, layer=layer)
    return ta.attention(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale, kv_start=kv_start,
                        impl=impl, config=config, layer=layer)


def rms_norm(kernels: KernelTuning, x, w, eps: float, *, layer=None, unit_offset: bool = False):
    """ddtree_jax.kernels.norms.rms_norm with `norm_choice`'s impl (under --tp a kernel runs on
    every device over the replicated x)."""
    impl = norm_choice(kernels, norms.norm_unsupported(x))

    def call(x, w, layer):
        return norms.rms_norm(x, w, eps, impl=impl, layer=layer, deterministic=kernels.deterministic,
                              unit_offset=unit_offset)

    if kernels.mesh is None or impl == "xla":
        return call(x, w, layer)
    return _per_shard(kernels, call, (x, *split_row(w, layer)), (P(),) * 3, P())


def rms_norm_casts(kernels: KernelTuning, x, w, eps: float, *, unit_offset: bool = False):
    """A norm whose casts are transformers' own (the hybrid models'): XLA's reference, or in the
    deterministic mode the norm kernel (a row's sum in one order whatever the rows)."""
    if kernels.deterministic:
        return rms_norm(kernels, x, w, eps, unit_offset=unit_offset)
    return norms.rms_norm_reference(x, w, eps, unit_offset=unit_offset)


def add_rms_norm(kernels: KernelTuning, x, delta, w, eps: float, *, layer=None):
    """ddtree_jax.kernels.norms.add_rms_norm with `norm_choice`'s impl (under --tp as rms_norm)."""
    impl = norm_choice(kernels, norms.norm_unsupported(x))

    def call(x, delta, w, layer):
        return norms.add_rms_norm(x, delta, w, eps, impl=impl, layer=layer, deterministic=kernels.deterministic)

    if kernels.mesh is None or impl == "xla":
        return call(x, delta, w, layer)
    return _per_shard(kernels, call, (x, delta, *split_row(w, layer)), (P(),) * 4, (P(), P()))


def qk_norm_rope(kernels: KernelTuning, qkv, q_norm_w, k_norm_w, cos, sin, *, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float, layer=None):
    """ddtree_jax.kernels.norms.qk_norm_rope with `norm_choice`'s impl. Under --tp a kernel runs per
    shard: over a device's heads where qkv is q alone (its columns cut on head boundaries, as
    sharding.py cuts q), else over the whole replicated qkv on every device."""
    impl = norm_choice(kernels, norms.qk_unsupported(qkv, head_dim))
    kw = dict(num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps, impl=impl, deterministic=kernels.deterministic)
    args = (qkv, q_norm_w, k_norm_w, cos, sin, layer)
    if kernels.mesh is None or impl == "xla":
        return norms.qk_norm_rope(*args[:5], num_heads=num_heads, layer=layer, **kw)
    n = shards(kernels)
    by_heads = num_kv_heads == 0 and num_heads % n == 0
    heads = num_heads // n if by_heads else num_heads

    def call(qkv, q_norm_w, k_norm_w, cos, sin, layer):   # the outputs that are arrays
        out = norms.qk_norm_rope(qkv, q_norm_w, k_norm_w, cos, sin, num_heads=heads, layer=layer, **kw)
        return tuple(o for o in out if o is not None)

    if by_heads:
        ax = kernels.mesh.axis_names[0]
        specs = (_spec(qkv.ndim, qkv.ndim - 1, ax), P(), P(), P(), P(), P())
        [q] = _per_shard(kernels, call, args, specs, (_spec(qkv.ndim + 1, qkv.ndim - 1, ax),))
        return q, None, None
    outs = iter(_per_shard(kernels, call, args, (P(),) * 6, (P(),) * (bool(num_heads) + 2 * bool(num_kv_heads))))
    q = next(outs) if num_heads else None
    return (q, *((next(outs), next(outs)) if num_kv_heads else (None, None)))


def matmul(kernels: KernelTuning, x, w, **kw):
    """ddtree_jax.kernels.matmul.matmul (its keyword arguments but impl and config) with
    `matmul_choice`'s impl and config."""
    impl, config = matmul_choice(kernels, x.shape, w, kw.get("prologue"))
    if kernels.deterministic:
        matmul_path(kernels, x.shape, w, kw.get("prologue"))     # raises where the kernel cannot take it
    return mm.matmul(x, w, impl=impl, config=config, **kw)


EXPERT_ROW_TILE = mm.DETERMINISTIC_ROW_TILE  # the rows of an `expert_matmul` tile


def expert_rows(kernels: KernelTuning, experts, num_experts: int):
    """(dest, groups, tile): matmul.group_rows of the rows' experts [A] in the deterministic
    product's row tiles of `tile` rows: where an MoE's experts put each (token, expert) row for
    `expert_matmul` (an array of groups.shape[0] * tile rows)."""
    return (*mm.group_rows(experts, num_experts, EXPERT_ROW_TILE), EXPERT_ROW_TILE)


def expert_matmul(kernels: KernelTuning, x, w, groups, **kw):
    """matmul.grouped_matmul of expert_rows' layout with matmul.grouped_config (fixed by the
    weight's shape: in the deterministic mode a row's product is its one-row product, whatever the pass)."""
    return mm.grouped_matmul(x, w, groups, config=mm.grouped_config(*w.shape[1:]),
                             interpret=kernels.matmul == "pallas_interpret", **kw)


def row_sum(kernels: KernelTuning, x):
    """x summed over its last axis: in the deterministic mode by halves, zero-padded to a power of
    two (elementwise adds: one order whatever the leading dims, where XLA's reduction picks its
    strategy from the whole shape), else jnp.sum."""
    if not kernels.deterministic:
        return jnp.sum(x, axis=-1)
    n = x.shape[-1]
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, (1 << max(0, (n - 1).bit_length())) - n)])
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def gdn_recurrence(kernels: KernelTuning, q, k, v, g, beta, order, depth, s0):
    """The Gated DeltaNet core node by node (gdn_recurrence.recurrence: one code path for a step, a
    tree and a commit): the deterministic mode's, compiled or interpreted as its attention, or a
    tree verify's under gdn_tree "recurrent", interpreted where this device runs no Triton kernels."""
    if not kernels.gdn_recurrent:
        raise ValueError("the node-by-node Gated DeltaNet kernel is the deterministic mode's and gdn_tree "
                         "'recurrent''s; models.gdn runs the parallel form otherwise")
    interpret = kernels.attention == "pallas_interpret" if kernels.deterministic else kernels.auto_attention != "pallas"

    if kernels.mesh is None:
        return gdn_rec.recurrence(q, k, v, g, beta, order, depth, s0, interpret=interpret)

    def call(*args):   # the arrays a shard returns (o is None without q)
        o, states = gdn_rec.recurrence(*args, interpret=interpret)
        return states if o is None else (o, states)

    # under --tp each device steps its own key and value heads (contiguous blocks: gdn.group_qkv)
    ax = kernels.mesh.axis_names[0]
    heads, gates, state, states = _spec(4, 2, ax), _spec(3, 2, ax), _spec(4, 1, ax), _spec(5, 1, ax)
    out = _per_shard(kernels, call, (q, k, v, g, beta, order, depth, s0),
                     (heads, heads, heads, gates, gates, P(), P(), state), states if q is None else (heads, states))
    return (None, out) if q is None else out


# ----------------------------------------------------------------------------- per shard (--tp)

def shards(kernels: KernelTuning) -> int:
    """Devices the round is sharded over (`KernelTuning.mesh`; 1: none)."""
    return 1 if kernels.mesh is None else kernels.mesh.devices.size


def _per_shard_refused(impl: str, family: str, why: str) -> None:
    """ValueError, one line, for an explicit kernel impl of a family that runs XLA's ops under --tp."""
    if impl not in ("auto", "xla"):
        raise ValueError(f"{family} impl {impl!r} does not run per shard under --tp ({why}); use 'auto' or 'xla'")


def _spec(ndim: int, axis: int, name: str) -> P:
    """The PartitionSpec of an ndim array cut along `axis` over the mesh axis `name`."""
    return P(*(name if i == axis else None for i in range(ndim)))


def _shard_struct(x, axis: int, n: int) -> jax.ShapeDtypeStruct:
    """One device's share of x cut n ways along `axis`."""
    return jax.ShapeDtypeStruct((*x.shape[:axis], x.shape[axis] // n, *x.shape[axis + 1:]), x.dtype)


def _per_shard(kernels: KernelTuning, fn, args: tuple, specs: tuple, out_specs):
    """fn(*args) on every device of kernels.mesh over its share of each argument (`specs`: one
    PartitionSpec an argument, for all of its leaves), inside jax.shard_map: a Pallas call, which
    GSPMD cannot partition. Leaves that are not arrays (a static layer index) stay fn's constants."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    leaf_specs = [s for a, s in zip(args, specs) for _ in jax.tree_util.tree_leaves(a)]
    live = [i for i, x in enumerate(leaves) if isinstance(x, (jax.Array, np.ndarray))]

    def body(*xs):
        full = list(leaves)
        for i, x in zip(live, xs):
            full[i] = x
        return fn(*jax.tree_util.tree_unflatten(tree, full))

    # check_vma off: a pallas_call states no varying mesh axes of its outputs
    return jax.shard_map(body, mesh=kernels.mesh, in_specs=tuple(leaf_specs[i] for i in live), out_specs=out_specs,
                         check_vma=False)(*(leaves[i] for i in live))


def _attention_per_shard(kernels: KernelTuning, q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *,
                         scale: float, kv_start=None, layer=None):
    """`attention` under --tp: q and the new K/V by heads, the caches ([L,] Bt, Hkv, S, Dh) by kv
    heads, lengths and the mask replicated; a device's query heads are the ones its kv heads
    serve (GQA groups stay whole where the kv heads divide). The impl is the one a device's
    shapes choose; an XLA one GSPMD partitions as it is."""
    n = shards(kernels)
    hkv = k_new.shape[2]
    if hkv % n:
        raise ValueError(f"{hkv} kv heads do not split over {n} devices (sharding.check_tp refuses this --tp)")
    one = dataclasses.replace(kernels, mesh=None)
    cache_axis = k_cache.ndim - 3
    local_cache = _shard_struct(k_cache, cache_axis, n)
    k_layer = local_cache if layer is None else jax.ShapeDtypeStruct(local_cache.shape[1:], k_cache.dtype)
    impl, _ = attention_choice(one, _shard_struct(q, 2, n), k_layer, kv_start, local_cache)
    if impl == "xla":
        return attention_reference(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                                   kv_start=kv_start, layer=layer)

    def call(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer):
        return attention(one, q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                         kv_start=kv_start, layer=layer)

    ax = kernels.mesh.axis_names[0]
    heads, cache = _spec(4, 2, ax), _spec(k_cache.ndim, cache_axis, ax)
    return _per_shard(kernels, call, (q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer),
                      (heads, heads, heads, cache, cache, P(), P(), P(), P()), heads)


def write_cache_rows(kernels: KernelTuning, caches, news, start, rows, **kw):
    """ddtree_jax.kernels.cache_write.write_cache_rows with `cache_choice`'s impl."""
    return cw.write_cache_rows(caches, news, start, rows, impl=cache_choice(kernels), **kw)
