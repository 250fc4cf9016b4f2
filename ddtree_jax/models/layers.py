"""Building blocks shared by the target and the drafter: norms, RoPE, projections, MLP, KV cache."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.models.config import RopeConfig, rope_inv_freq
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels.cache_write import write_cache_rows
from ddtree_jax.kernels.stacking import StackedRow, one_layer
from ddtree_jax.tuning import XLA_KERNELS, KernelTuning


def rms_norm(x: jax.Array, w, eps: float) -> jax.Array:
    # Computed in float32 and cast back, as Hugging Face's Qwen3RMSNorm / LlamaRMSNorm do.
    w = one_layer(w)    # a StackedRow: its row
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return w.astype(x.dtype) * y.astype(x.dtype)


def linear(x: jax.Array, w, b: jax.Array | None = None, *, kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """x [..., in] @ w [in, out] (+ b); w an array or an Int8Weight (a quantized drafter's).
    kernels: how the product runs (ddtree_jax.kernels.dispatch.matmul; XLA's: one XLA dot)."""
    y = dispatch.matmul(kernels, x, w)
    return y if b is None else y + b.astype(y.dtype)


def mlp(p: dict, x: jax.Array, *, kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """The gated MLP's output."""
    if "gate_up" in p:  # fused at load time (fuse_layer_weights): one matmul instead of two
        gate_up = linear(x, p["gate_up"], kernels=kernels)
        if dispatch.fuses_prologues(kernels):
            # silu(gate) * up as the down product's prologue: in the kernel, as it loads (one kernel fewer)
            return dispatch.matmul(kernels, gate_up, p["down"], prologue="swiglu")
        gate, up = jnp.split(gate_up, 2, axis=-1)
    else:
        gate, up = linear(x, p["gate"], kernels=kernels), linear(x, p["up"], kernels=kernels)
    return linear(jax.nn.silu(gate) * up, p["down"], kernels=kernels)


# The norm weights of a layer that the inference layout stacks (stack_norms), by stack name.
NORM_STACKS = {"in": "attn_norm", "mlp": "mlp_norm", "q": "q_norm", "k": "k_norm"}


def stack_norms(params: dict) -> dict:
    """The inference layout's norm weights: every layer's attention (input) norm and then the
    final norm ("norm") stacked in "norms"["in"] [L + 1, H], the MLP norms in "mlp" [L, H], the
    q / k norms (where every layer has them) in "q" / "k" [L, Dh]; the layers and the top keep
    none. Why: a jitted call spends host time on every buffer it takes (~2.7 us a weight on the
    H200), and the 8B pair's ~170 norm vectors were half its weights' 338 leaves; the
    norm kernels take the stacked array and the layer, read at run time (ddtree_jax.kernels.norms,
    ddtree_jax.kernels.matmul's rmsnorm prologue). layer_view hands them to a layer's code."""
    layers = params["layers"]
    if not layers or "norms" in params:
        return params
    norms = {"in": jnp.stack([p["attn_norm"] for p in layers] + [params["norm"]]),
             "mlp": jnp.stack([p["mlp_norm"] for p in layers])}
    for name in ("q", "k"):
        if all(NORM_STACKS[name] in p for p in layers):
            norms[name] = jnp.stack([p[NORM_STACKS[name]] for p in layers])
    stacked = {NORM_STACKS[n] for n in norms}
    top = {k: v for k, v in params.items() if k != "norm"}
    return {**top, "norms": norms, "layers": [{k: v for k, v in p.items() if k not in stacked} for p in layers]}


def stacks_norms_for(kernels: KernelTuning) -> bool:
    """Whether the inference layout should stack the norm weights (stack_norms) for a model run
    with these kernels (the norms' and the products'; "auto" takes kernels on NVIDIA GPUs
    only): yes where a kernel reads them (a norm kernel, a product's rmsnorm
    prologue), which takes the stack and the layer at run time, and fewer buffers make a call's
    host work shorter; no where only XLA reads them. There a stacked weight's row is a
    constant-index read inside each layer's norm fusion, which makes every layer's fusion a new
    one to compile, where per-layer weights compile one fusion for all (a 36-layer tiny pair on
    XLA:CPU: the prefill's compilation 3.6 s stacked, 1.3 s per layer)."""
    return dispatch.takes_kernels(kernels, "norms") or dispatch.takes_kernels(kernels, "matmul")


def layer_view(params: dict, i: int) -> dict:
    """Layer i's params as its code reads them: the layer's own dict, its norm weights (where
    stack_norms stacked them) as StackedRows of the stacks (the kernels take the stack and the
    layer; XLA's paths the row)."""
    p = params["layers"][i]
    norms = params.get("norms")
    if norms is None:
        return p
    return {**p, **{NORM_STACKS[name]: StackedRow(w, i) for name, w in norms.items()}}


def final_norm(params: dict):
    """The final norm's weight: "norm", or the last row of the stacked input norms."""
    norms = params.get("norms")
    return params["norm"] if norms is None else StackedRow(norms["in"], len(params["layers"]))


def fuse_layer_weights(p: dict, groups: dict[str, tuple[str, ...]]) -> dict:
    """Concatenate projections that read the same input into one matrix, e.g. {"qkv": ("q","k","v")},
    along the output (last) axis, so stacked expert weights [E, H, I] fuse as well as [H, I].

    At batch 1 a decoder step is a chain of small matmuls whose launches cost as much as their
    bytes; fewer, wider matmuls read the same bytes with fewer launches. Biases follow. A group
    none of whose names the layer has is skipped (an MoE layer has no dense gate/up, a dense
    layer no experts; a layer may come already fused); one with some of them is an error.
    """
    p = dict(p)
    for fused, names in groups.items():
        have = [n in p for n in names]
        if not any(have):
            continue
        if not all(have):
            raise ValueError(f"cannot fuse {fused!r}: the layer has {[n for n in names if n in p]} "
                             f"but not {[n for n in names if n not in p]}")
        p[fused] = jnp.concatenate([p.pop(n) for n in names], axis=-1)
        if all(f"{n}_bias" in p for n in names):
            p[f"{fused}_bias"] = jnp.concatenate([p.pop(f"{n}_bias") for n in names], axis=-1)
    return p


@functools.lru_cache(maxsize=None)
def _inv_freq(rope: RopeConfig, head_dim: int) -> tuple[np.ndarray, float]:
    freqs, scale = rope_inv_freq(rope, head_dim)
    return np.asarray(freqs, np.float32), scale


def rope_tables(positions: jax.Array, rope: RopeConfig, head_dim: int) -> tuple[jax.Array, jax.Array]:
    """cos/sin of shape [..., head_dim] for integer positions [...] (HF's half-rotation layout)."""
    inv, scale = _inv_freq(rope, head_dim)
    ang = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv)
    ang = jnp.concatenate([ang, ang], axis=-1)
    return jnp.cos(ang) * scale, jnp.sin(ang) * scale


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x: [Bt, T, H, Dh]; cos/sin: [Bt, T, Dh]."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rot = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, :, None] + rot * sin[:, :, None]).astype(x.dtype)


def split_heads(x: jax.Array, n_heads: int, head_dim: int) -> jax.Array:
    return x.reshape(*x.shape[:-1], n_heads, head_dim)


def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Plain attention without a cache. q: [Bt,T,Hq,Dh]; k,v: [Bt,S,Hkv,Dh]; mask: bool [Bt,T,S]."""
    bt, t, hq, dh = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    qg = q.reshape(bt, t, hkv, g, dh)
    s = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    s = jnp.where(mask[:, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkgts,bskd->btkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return o.reshape(bt, t, hq, dh).astype(q.dtype)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    """K/V of committed tokens, every layer's stacked: k and v [L, Bt, Hkv, S, Dh].

    Two arrays, not two per layer: every buffer a jitted call takes or returns costs host time at
    each call (~7.7 us a donated one on the H200), and the kernels
    read and write a layer of the stacked array by an index given at run time (one compiled
    kernel for all layers). Positions at or beyond a row's length hold stale values; attention
    never reads them.
    """

    k: jax.Array
    v: jax.Array

    @staticmethod
    def zeros(num_layers: int, batch: int, num_kv_heads: int, length: int, head_dim: int, dtype) -> "KVCache":
        shape = (num_layers, batch, num_kv_heads, length, head_dim)
        return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @staticmethod
    def from_layers(ks, vs) -> "KVCache":
        """The cache of per-layer arrays [Bt, Hkv, S, Dh] (tests, conversions)."""
        return KVCache(jnp.stack(list(ks)), jnp.stack(list(vs)))

    @property
    def num_layers(self) -> int:
        return self.k.shape[0]

    @property
    def length(self) -> int:
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.size * self.k.dtype.itemsize


def append(cache: KVCache, new_k: list[jax.Array], new_v: list[jax.Array], start: jax.Array,
           rows: jax.Array | None = None, *, kernels: KernelTuning = XLA_KERNELS) -> KVCache:
    """Write new K/V ([Bt, T, Hkv, Dh] per layer) at per-row positions start[Bt].

    rows [Bt, P] picks which of the T new entries to write, in order (the accepted path of a
    tree); entries past a row's accepted length may be anything, since their destinations lie
    beyond the row's new length. The verify pass never writes the cache itself, so nothing has to
    be compacted afterwards. kernels: how a `rows` write runs (dispatch.write_cache_rows: all
    layers in one kernel; XLA's path: a scatter a layer into the stacked array, in place); a
    whole-prompt write (rows None) is XLA's.
    """
    if rows is None:  # a prompt: every new entry, in order, through XLA's writes
        k, v = write_cache_rows([cache.k, cache.v], list(new_k) + list(new_v), start, None, impl="xla")
    else:
        k, v = dispatch.write_cache_rows(kernels, [cache.k, cache.v], list(new_k) + list(new_v), start, rows)
    return KVCache(k, v)


def append_stacked(cache: KVCache, kv: jax.Array, start: jax.Array, *,
                   kernels: KernelTuning = XLA_KERNELS) -> KVCache:
    """`append` of all rows of kv [Bt, T, 2 L, Hkv, Dh] (the L layers' K, then their V, as
    drafters.dflash.context_kv_stacked makes them) at start[Bt]: one cache-write kernel reading
    the stacked array where `kernels` takes the kernel, else one XLA write per layer and array."""
    n = cache.num_layers
    if kv.shape[2] != 2 * n:
        raise ValueError(f"append_stacked: kv holds {kv.shape[2]} arrays for a cache of {n} layers (K and V: {2 * n})")
    k, v = dispatch.write_cache_rows(kernels, [cache.k, cache.v], kv, start, None)    # every row, in order
    return KVCache(k, v)
