"""Tensor and expert parallelism over the devices of one host (`--tp N`), through jax.sharding.

One `Mesh` axis, "tp". The target's and the drafter's weights are placed by name, Megatron's way:
attention by heads (q/k/v by columns, o by rows), the MLP's gate/up by columns and down by rows,
an MoE block's experts along the expert axis (the router replicated), the embedding and LM head
by vocabulary where it divides, norms replicated. A hybrid target: its gated attention's q_proj
(per head [query | gate]) by columns; its Gated DeltaNet layers by heads: the conv input's
channels reordered into a block of [q | k | v] heads a device (gdn.group_qkv), then qkv, z, b, a,
A_log and dt_bias by columns, the conv and its state by channels, the recurrent state by value
heads and the output by rows. The KV caches go by kv heads; everything else (the tree, the
walk, sampling) is tiny and replicated. The engine is unchanged: its jitted round takes sharded
arrays and GSPMD partitions it, inserting the all-reduces after o, down, out and the experts. The
Pallas attention, norm and recurrence kernels, which GSPMD cannot partition, run per shard inside
jax.shard_map (ddtree_jax/kernels/dispatch.py, told the mesh by `KernelTuning.mesh`:
`sharded_kernels`); the products and cache writes run XLA's ops.

The inference layout under tp > 1 keeps q/k/v and gate/up as separate matrices: a fused [q | k | v]
cut evenly across devices would not fall on head boundaries, and every layer would reshard.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from ddtree_jax.errors import UserError
from ddtree_jax.models.config import DrafterConfig, TargetConfig
from ddtree_jax.models.family import Dense, HybridCache, family_of
from ddtree_jax.models.gdn import GdnConfig, group_qkv
from ddtree_jax.models.layers import KVCache, stack_norms
from ddtree_jax.tuning import KernelTuning, TreeTuning, Tuning, VocabTopK

AXIS = "tp"

# weights sharded by their output columns (heads, MLP width), by their input rows, along experts
# "qg": a gated attention's q_proj as stored, per head [query | gate]: an even cut falls on heads;
# "qkv" (grouped by gdn.group_qkv), "z", "b", "a", "A_log", "dt_bias": a Gated DeltaNet layer's, by heads
_COLUMNS = {"q", "qg", "q_gate", "k", "v", "gate", "up", "shared_gate", "shared_up", "qkv", "z", "b", "a", "A_log",
            "dt_bias"}
_COLUMN_BIASES = {"q_bias", "qg_bias", "q_gate_bias", "k_bias", "v_bias"}
_ROWS = {"o", "down", "shared_down", "out", "conv"}   # "conv" [C, 1, K]: a GDN conv's channels
_EXPERTS = {"experts_gate", "experts_up", "experts_gate_up", "experts_down"}


def parse_tp(text: str | int) -> int | str:
    """--tp's value: a whole number >= 1 or "auto"."""
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except (TypeError, ValueError):
        raise UserError(f"--tp must be a number of devices or auto (got {text!r})") from None
    if n < 1:
        raise UserError(f"--tp must be >= 1 (got {n})")
    return n


def _divided(tcfg: Any, dcfg: DrafterConfig | None) -> list[tuple[str, int]]:
    """(what, size) of every dimension tensor parallelism cuts (a TargetConfig or a HybridConfig)."""
    dims = [("the target's attention heads", tcfg.num_heads), ("the target's kv heads", tcfg.num_kv_heads)]
    if getattr(tcfg, "gdn", None) is not None:
        dims.append(("the target's Gated DeltaNet key heads", tcfg.gdn.num_k_heads))
    if tcfg.moe is None or not all(tcfg.moe.sparse_layers):
        dims.append(("the target's MLP width (intermediate_size)", tcfg.intermediate_size))
    if tcfg.moe is not None:
        dims.append(("the target's experts", tcfg.moe.num_experts))
        if tcfg.moe.shared_intermediate:
            dims.append(("the shared expert's width", tcfg.moe.shared_intermediate))
    if dcfg is not None:
        dims += [("the drafter's attention heads", dcfg.num_heads), ("the drafter's kv heads", dcfg.num_kv_heads),
                 ("the drafter's MLP width", dcfg.intermediate_size)]
    return dims


def valid_tp(tp: int, tcfg: TargetConfig, dcfg: DrafterConfig | None) -> str | None:
    """Why `tp` devices cannot share this model (None: they can)."""
    for what, n in _divided(tcfg, dcfg):
        if n % tp:
            return f"{what} ({n})"
    return None


def check_tp(tp: int, tcfg: Any, dcfg: DrafterConfig | None, num_devices: int | None = None) -> None:
    """UserError of one line unless `tp` devices (of `num_devices`) can share the model."""
    if num_devices is None:
        num_devices = len(jax.devices())
    if tp > num_devices:
        raise UserError(f"--tp {tp} needs {tp} devices and this host has {num_devices} "
                        f"({jax.devices()[0].platform}); lower --tp")
    if tp == 1:
        return
    why = valid_tp(tp, tcfg, dcfg)
    if why is not None:
        fits = [n for n in range(1, num_devices + 1) if valid_tp(n, tcfg, dcfg) is None]
        raise UserError(f"--tp {tp} does not divide {why}; use --tp {' or '.join(map(str, fits))}")


def make_mesh(tp: int, devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A one-axis ("tp") mesh over the first `tp` devices."""
    devices = list(jax.devices() if devices is None else devices)[:tp]
    return Mesh(np.asarray(devices), (AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


# kernel families that run XLA's ops under tp > 1, and the flag that picks each one's impl
XLA_ONLY = {"matmul": "--matmul-impl", "cache": "--cache-impl"}


def check_tp_impls(tp: int, impls: dict[str, str]) -> None:
    """UserError of one line where an explicit impl (family -> impl, as dispatch names the
    families) asks a kernel that does not run per shard to run on `tp` > 1 devices."""
    bad = [f"{XLA_ONLY[k]} {v}" for k, v in impls.items() if k in XLA_ONLY and v not in ("auto", "xla")]
    if tp > 1 and bad:
        raise UserError(f"--tp {tp} runs the products and cache writes on XLA's ops (their kernels do not run per "
                        f"shard; the attention and norm kernels do); drop {', '.join(bad)}")


# gather beat dense up to ~4 tokens on one H100 (Qwen3-30B-A3B's shape: 118 us a layer at 1, 301 at 4)
SHARDED_GATHER_MAX = 4


def sharded_kernels(kernels: KernelTuning, mesh: Mesh) -> KernelTuning:
    """The kernels of a round sharded over `mesh`: the attention and norm kernels per shard (dispatch
    runs a Pallas call inside shard_map: heads, kv heads, the replicated hidden state), the
    products and cache writes on XLA's ops, which GSPMD partitions (XLA_ONLY), and an MoE's grouped
    experts (a Pallas product) as "dense", which it partitions along the expert axis, with passes of
    up to SHARDED_GATHER_MAX tokens gathering their experts (dense would read every expert for them)."""
    moe = {}
    if kernels.moe_experts == "grouped":
        moe = dict(moe_experts="dense", moe_gather_max=max(kernels.moe_gather_max, SHARDED_GATHER_MAX))
    return dataclasses.replace(kernels, mesh=mesh, **moe, **{k: "xla" for k in XLA_ONLY})


def sharded_tuning(tuning: Tuning, mesh: Mesh) -> Tuning:
    """`tuning` for a round sharded over `mesh`: the target's and the drafter's kernels
    `sharded_kernels`, the tree build `tree_tuning`'s."""
    drafter = None if tuning.drafter_kernels is None else sharded_kernels(tuning.drafter_kernels, mesh)
    return dataclasses.replace(tuning, tree=tree_tuning(mesh.devices.flat[0]),
                               kernels=sharded_kernels(tuning.kernels, mesh), drafter_kernels=drafter)


# ----------------------------------------------------------------------------- per-tensor rules


def param_spec(name: str, shape: tuple[int, ...], tp: int) -> P:
    """The PartitionSpec of one weight (by its name in names.py's layout, or the inference
    layout's) over `tp` devices."""
    if name in _COLUMNS or name in _COLUMN_BIASES:
        return P(*([None] * (len(shape) - 1)), AXIS)
    if name in _ROWS:
        return P(AXIS, None)
    if name in _EXPERTS:
        return P(AXIS, *([None] * (len(shape) - 1)))
    if name == "embed" and shape[0] % tp == 0:        # [V, H]: a row a token, by vocabulary
        return P(AXIS, None)
    if name == "lm_head" and shape[-1] % tp == 0:     # [H, V]: each device a slice of the logits
        return P(None, AXIS)
    return P()   # norms, the router, the drafter's fc, small gates


def shard_count(name: str, shape: tuple[int, ...], tp: int) -> int:
    """Devices one weight is cut across (1: replicated)."""
    return tp if tp > 1 and any(a is not None for a in param_spec(name, shape, tp)) else 1


def _named(tree: dict) -> Iterable[tuple[str, Any]]:
    """(name, leaf) of every weight of a names.py param tree, layers included."""
    for k, v in tree.items():
        if k == "layers":
            for layer in v:
                yield from _named(layer)
        elif isinstance(v, dict):   # a hybrid layer's Gated DeltaNet params ("linear")
            yield from v.items()
        else:
            yield k, v


def weight_bytes_per_device(params: dict | None, tp: int) -> int:
    """Bytes of a (lazy or host) param tree that one of `tp` devices holds."""
    if params is None:
        return 0
    return sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize // shard_count(n, tuple(x.shape), tp)
               for n, x in _named(params))


def cache_bytes_per_device(tcfg: Any, dcfg: DrafterConfig | None, positions: int, itemsize: int,
                           tp: int, batch: int = 1) -> int:
    """Bytes of the target's (and drafter's) caches of `positions` positions on one of `tp` devices."""
    caches = [family_of(tcfg).cache_bytes(tcfg, batch, positions, itemsize)]
    if dcfg is not None:
        caches.append(Dense.cache_bytes(dcfg, batch, positions, itemsize))
    return sum(caches) // tp


def auto_tp(tcfg: Any, dcfg: DrafterConfig | None, weights_at: Callable[[int], int], itemsize: int,
            limit: int | None, num_devices: int, positions: int = 4096) -> int:
    """`--tp auto`: the fewest devices that divide the model and hold its weights (`weights_at(tp)`
    bytes a device) and the caches (`itemsize` bytes a value) of one request of `positions`
    positions. Without a known device memory (`limit` None), one device."""
    if limit is None:
        return 1
    positions = min(positions, tcfg.max_position)
    for tp in range(1, num_devices + 1):
        if tp > 1 and valid_tp(tp, tcfg, dcfg) is not None:
            continue
        if weights_at(tp) + cache_bytes_per_device(tcfg, dcfg, positions, itemsize, tp) <= limit:
            return tp
    need = weights_at(num_devices) / 2**30
    raise UserError(f"--tp auto: the weights need {need:.2f} GiB a device even on all {num_devices} devices, and one "
                    f"holds {limit / 2**30:.2f} GiB; use a smaller dtype (--dtype bfloat16) or more devices")


def draft_head_bytes(tcfg: TargetConfig, with_drafter: bool, itemsize: int, tp: int) -> int:
    """Bytes of the drafter's replicated LM head copy (`with_replicated_head`) on each device."""
    return tcfg.vocab_size * tcfg.hidden_size * itemsize if with_drafter and tp > 1 else 0


def check_weights_fit(params: Sequence[dict | None], tp: int, limit: int | None, device_kind: str,
                      extra: int = 0) -> None:
    """Before any tensor is read: the weights' share of one device (and `extra` bytes each
    device holds besides) must fit its memory."""
    if limit is None:
        return
    need = sum(weight_bytes_per_device(p, tp) for p in params) + extra
    if need > limit:
        more = "raise --tp (or --tp auto)" if tp < len(jax.devices()) else "use a smaller --dtype"
        raise UserError(f"not enough device memory: the weights need {need / 2**30:.2f} GiB a device on --tp {tp}, "
                        f"and a {device_kind} holds {limit / 2**30:.2f} GiB; {more}")


# ----------------------------------------------------------------------------- loading


class Streamer:
    """Puts tensors (host or device) on the mesh, each where --tp places it (param_spec), one at a
    time: a tensor is read while the one before it is still being copied, and that copy is waited
    for before the next starts, so the host holds at most two tensors."""

    def __init__(self, mesh: Mesh):
        self.mesh, self.tp = mesh, mesh.devices.size
        self.in_flight: list[jax.Array] = []

    def put(self, name: str, x) -> jax.Array:
        if isinstance(x, jax.Array):
            host = x
        else:
            host = np.asarray(x)
        spec = param_spec(name, tuple(host.shape), self.tp)
        if self.in_flight:
            self.in_flight.pop().block_until_ready()
        out = jax.device_put(host, NamedSharding(self.mesh, spec))
        self.in_flight.append(out)
        return out

    def layer(self, layer: dict) -> dict:
        """A layer's tensors put, a hybrid layer's Gated DeltaNet params ("linear", a dict) included."""
        return {k: {n: self.put(n, x) for n, x in v.items()} if isinstance(v, dict) else self.put(k, v)
                for k, v in layer.items()}


def _host_fused(layer: dict, groups: dict[str, tuple[str, ...]]) -> dict:
    """`fuse_layer_weights` on the host (numpy), before the device put: the fused tensor is placed
    once, by its own rule."""
    layer = dict(layer)
    for fused, names in groups.items():
        if all(n in layer for n in names):
            layer[fused] = np.concatenate([np.asarray(layer.pop(n)) for n in names], axis=-1)
    return layer


def put_target(params: dict, mesh: Mesh, *, stack: bool, gdn: GdnConfig | None = None) -> dict:
    """The target's inference layout for tp > 1, each tensor streamed to its sharded placement:
    experts' gate/up fused (along the unsharded last axis), q/k/v and gate/up kept apart, a hybrid
    target's conv channels in `gdn.qkv_groups` (the devices') blocks of heads."""
    s = Streamer(mesh)
    top = {k: s.put(k, v) for k, v in params.items() if k != "layers"}
    layers = []
    for layer in params["layers"]:
        layer = _host_fused(layer, {"experts_gate_up": ("experts_gate", "experts_up")})
        if "linear" in layer:
            if gdn is None or gdn.qkv_groups != s.tp:
                raise ValueError(f"a hybrid target on {s.tp} devices needs its GdnConfig with qkv_groups={s.tp}")
            layer = {**layer, "linear": group_qkv(layer["linear"], gdn)}
        layers.append(s.layer(layer))
    out = {**top, "layers": layers}
    return _stacked(out, mesh) if stack else out


def put_drafter(params: dict, mesh: Mesh, *, stack: bool) -> dict:
    """The drafter's layout for tp > 1: no fusion (no "ctx_kv": its columns mix layers, so the
    context K/V run per layer, each by heads), each tensor streamed to its sharded placement."""
    s = Streamer(mesh)
    top = {k: s.put(k, v) for k, v in params.items() if k != "layers"}
    out = {**top, "layers": [s.layer(p) for p in params["layers"]]}
    return _stacked(out, mesh) if stack else out


def with_replicated_head(dparams: dict, head: jax.Array, mesh: Mesh) -> dict:
    """The drafter with its own LM head (its copy where it has one, else the target's [H, V])
    replicated: its log-probs then come whole to every device, and the tree build's top-k runs
    unpartitioned (XLA:CPU aborts compiling a vocabulary-sharded top-k that feeds the DDTree
    policy's optimization barrier). The draft's tokens are the same; the output never depends on them."""
    own = dparams.get("lm_head", head)
    return {**dparams, "lm_head": jax.device_put(own, replicated(mesh))}


def _stacked(params: dict, mesh: Mesh) -> dict:
    """stack_norms with the stacks replicated over the mesh."""
    out = stack_norms(params)
    if "norms" in out:
        out["norms"] = jax.device_put(out["norms"], replicated(mesh))
    return out


def put_replicated(tree, mesh: Mesh):
    """A small pytree (the oracle drafter's params) on every device of the mesh."""
    return jax.device_put(tree, replicated(mesh))


# ----------------------------------------------------------------------------- the state


def state_shardings(shapes, mesh: Mesh):
    """ShapeDtypeStructs of a state (engine.State) with their placements: every KVCache [L, Bt,
    Hkv, S, Dh] by kv heads, a hybrid target's conv states [Lg, Bt, K-1, C] by channels and
    recurrent states [Lg, Bt, Hv, dk, dv] by value heads, the rest replicated."""
    heads = NamedSharding(mesh, P(None, None, AXIS, None, None))
    channels = NamedSharding(mesh, P(None, None, None, AXIS))
    rep = replicated(mesh)

    def place(x, sharding):
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    def walk(x):
        if isinstance(x, KVCache):
            return KVCache(place(x.k, heads), place(x.v, heads))
        if isinstance(x, HybridCache):
            return dataclasses.replace(x, kv=walk(x.kv), conv=place(x.conv, channels), rec=place(x.rec, heads))
        return jax.tree_util.tree_map(lambda a: place(a, rep), x)

    return jax.tree_util.tree_map(walk, shapes, is_leaf=lambda x: isinstance(x, (KVCache, HybridCache)))


def zeros_like_shapes(shapes):
    """Zero arrays of ShapeDtypeStructs, each in its own placement."""
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype, device=s.sharding), shapes)


def placed_like(tree, shapes):
    """`tree`'s arrays moved to the placements of `shapes` (a no-op for those already there)."""
    return jax.tree_util.tree_map(
        lambda x, s: x if x.sharding.is_equivalent_to(s.sharding, x.ndim) else jax.device_put(x, s.sharding),
        tree, shapes)


def per_device_nbytes(tree) -> int:
    """Bytes one device holds of a pytree of (sharded) arrays."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shape = x.sharding.shard_shape(x.shape) if getattr(x, "sharding", None) is not None else x.shape
        total += math.prod(shape) * np.dtype(x.dtype).itemsize
    return total


def tree_tuning(device) -> TreeTuning:
    """How the tree build runs under tp > 1: XLA's ops, no Pallas call (GSPMD cannot partition
    one; the tree build's kernels do not run in shard_map). On the CPU the vocabulary top-k takes
    its two-stage form (the interpreted threshold kernels: plain XLA ops): XLA:CPU aborts
    compiling a multi-device program whose lax.top_k feeds an optimization barrier directly, as
    the one-stage form's does. The same tree."""
    if device.platform == "cpu":
        return TreeTuning(vocab_topk=VocabTopK(chunks=2))
    return TreeTuning()
