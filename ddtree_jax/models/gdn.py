"""Gated DeltaNet linear attention: the `linear_attn` layers of Qwen3.5 / Qwen3.6 (transformers'
`qwen3_5` and `qwen3_5_moe`, whose layer is the same) as pure JAX functions: a prompt in chunks
(`prefill`), one decode token (`step`), a draft tree in one pass (`tree_verify`) and the commit of
its accepted path (`path_states`, `path_states_parallel`).

The math, per token t and value head h (which reads key head h // (Hv / Hk), as transformers'
repeat_interleave groups them):

    u_t  = x_t @ qkv                                 the conv input, C = 2 Hk dk + Hv dv channels
    c_t  = silu(sum_j conv[j] * u_{t-K+1+j})         causal depthwise conv over the last K inputs
    q, k, v = split(c_t, [Hk dk, Hk dk, Hv dv])      contiguous blocks; heads are contiguous within each
    q = l2norm(q) / sqrt(dk);  k = l2norm(k)         l2norm(x) = x / sqrt(sum x^2 + 1e-6)
    g_t  = -exp(A_log) * softplus(x_t @ a + dt_bias)     log decay, <= 0
    b_t  = sigmoid(x_t @ b)
    S    = exp(g_t) S;  S += k_t (b_t (v_t - k_t^T S))^T      the gated delta rule; S [dk, dv]
    o_t  = q_t^T S
    y_t  = (norm * rmsnorm(o_t) * silu(x_t @ z)) @ out   the gated RMSNorm per value head (eps rms_eps)

Parameters (our name: shape <- Hugging Face `...layers.{i}.linear_attn.` name: shape; H hidden,
Hk / Hv key / value heads, dk / dv their sizes, K the conv window; `params_from_hf` maps them):

    qkv     [H, 2 Hk dk + Hv dv]  <- in_proj_qkv.weight [2 Hk dk + Hv dv, H], transposed
    z       [H, Hv dv]            <- in_proj_z.weight [Hv dv, H], transposed
    b       [H, Hv]               <- in_proj_b.weight [Hv, H], transposed
    a       [H, Hv]               <- in_proj_a.weight [Hv, H], transposed
    conv    [C, 1, K]             <- conv1d.weight [C, 1, K], as stored (tap K-1 reads the newest input)
    A_log   [Hv]                  <- A_log
    dt_bias [Hv]                  <- dt_bias
    norm    [dv]                  <- norm.weight (the gated RMSNorm; no "1 +" offset)
    out     [Hv dv, H]            <- out_proj.weight [H, Hv dv], transposed
    in_proj [H, C + Hv dv + 2 Hv]  qkv | z | b | a: the inference layout (`fuse_params`) in their place

Under --tp the conv's C channels (qkv's columns, conv's rows, the conv state) are in G =
`qkv_groups` blocks, block i [q | k | v] of key heads i Hk/G.. and value heads i Hv/G.. (`group_qkv`):
an even cut of C over G devices then falls on heads, and each device runs its heads alone.

States of a sequence:

    conv_state [Bt, K-1, C], the model's dtype: the last K-1 conv inputs u, oldest first.
        transformers' cache holds the last K, [Bt, C, K]: ours is hf[:, :, 1:].transpose(0, 2, 1).
    rec_state  [Bt, Hv, dk, dv], float32: S, as transformers' cache holds it.

The tree. `tree_verify` runs N nodes in one pass, exactly as if each node's root path had been
stepped after the pre-round state: node i's conv window is the inputs of its K-1 nearest
ancestors (then the pre-round conv state), and its state is its parent's advanced by node i. The
parallel form (the chunked form's algebra with the ancestor mask in place of the causal one) needs
no node's state: o_i = exp(G_i) q_i S0 + sum_{j <= i} (q_i k_j) exp(G_i - G_j) w_j over i's root
path, where G is the root-path sum of g and the deltas w come from one unit-lower-triangular
solve over the tree. What a commit needs is then per node vectors (`TreeStates`: the conv input,
k, v, g, beta, w, G), since the state after an accepted path ending at node i is

    S_i = exp(G_i) S0 + sum_{j on the path} exp(G_i - G_j) k_j w_j^T.

Memory, per layer and sequence: every node's state is N Hv dk dv float32 (Qwen3.5's Hk = 16,
Hv = 32, dk = dv = 128: 2 MiB a node, 128 MiB a layer at N = 64); `TreeStates` is
N (C + Hk dk + 2 Hv dv + 3 Hv) numbers (72 KiB a node, 4.5 MiB a layer at N = 64: 28x less). So
the engine should keep `TreeStates`, never node states, and commit with `path_states_parallel`
(one masked product a layer: the state read and written once) rather than `path_states` (D+1
recurrent steps in sequence, `step`'s arithmetic: D+1 passes over the state).

The deterministic mode (kernels.deterministic) trades that for bitwise equality with decoding:
`step`, `tree_verify` and the commit (`path_states_recurrent`) all run the recurrent form node
by node in one kernel (ddtree_jax/kernels/gdn_recurrence.py), the norms in theirs. The prefill
keeps the chunked form: every method starts from the same prefill. The tuning's gdn_tree
"recurrent" runs the tree verify and the commit through that kernel outside the mode too: one
kernel a layer in place of the parallel form's products, solve and their small XLA ops.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.errors import ConfigError
from ddtree_jax.kernels import dispatch
from ddtree_jax.kernels.gdn_recurrence import preorder
from ddtree_jax.models.config import _Fields, _show
from ddtree_jax.models.layers import fuse_layer_weights, linear
from ddtree_jax.tuning import XLA_KERNELS, KernelTuning

# The state sums a whole text's updates: its float32 products must not drop to TF32 on GPUs.
_HI = jax.lax.Precision.HIGHEST
_L2_EPS = 1e-6  # transformers' l2norm (and FLA's) eps, not the config's


@dataclasses.dataclass(frozen=True)
class GdnConfig:
    """A Gated DeltaNet layer's sizes (hashable: a static argument of jax.jit)."""

    hidden: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    rms_eps: float = 1e-6
    chunk: int = 64  # prefill's chunk length (transformers' torch_chunk_gated_delta_rule's)
    qkv_groups: int = 1  # the conv channels' [q | k | v] blocks (module doc): the devices under --tp

    def __post_init__(self):
        for name in ("hidden", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "conv_kernel", "chunk",
                     "qkv_groups"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"GdnConfig: {name} is {_show(v)}; it must be an integer >= 1")
        if self.num_v_heads % self.num_k_heads:
            raise ConfigError(f"GdnConfig: num_v_heads ({self.num_v_heads}) is not a multiple of num_k_heads "
                              f"({self.num_k_heads}); each key head serves a whole group of value heads")
        if self.num_k_heads % self.qkv_groups:
            raise ConfigError(f"GdnConfig: {self.qkv_groups} qkv groups do not divide {self.num_k_heads} key heads")

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """C: the conv's channels, q | k | v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def group(self) -> int:
        """Value heads per key head."""
        return self.num_v_heads // self.num_k_heads

    @staticmethod
    def from_hf(d: dict[str, Any], where: str = "config.json") -> "GdnConfig":
        """The linear-attention layers of a qwen3_5 / qwen3_5_moe config.json: the top level
        (its text_config is read) or a text config. A bad or missing field is one ConfigError."""
        top = _Fields(d, where, missing_hint="; is this a Qwen3.5 (qwen3_5 / qwen3_5_moe) config?")
        f = top.sub("text_config") or top
        f.missing_hint = top.missing_hint
        if f.d.get("hidden_act", "silu") != "silu":
            raise f.bad("hidden_act", f.d["hidden_act"], '"silu" (the conv\'s activation)')
        cfg = dict(hidden=f.integer("hidden_size"), num_k_heads=f.integer("linear_num_key_heads"),
                   num_v_heads=f.integer("linear_num_value_heads"), head_k_dim=f.integer("linear_key_head_dim"),
                   head_v_dim=f.integer("linear_value_head_dim"), conv_kernel=f.integer("linear_conv_kernel_dim", 4),
                   rms_eps=f.number("rms_norm_eps", 1e-6))
        if cfg["num_v_heads"] % cfg["num_k_heads"]:
            raise ConfigError(f"{where}: {f.prefix}linear_num_value_heads ({cfg['num_v_heads']}) is not a multiple "
                              f"of {f.prefix}linear_num_key_heads ({cfg['num_k_heads']})")
        return GdnConfig(**cfg)


def params_from_hf(weights: Mapping[str, Any], cfg: GdnConfig, prefix: str = "") -> dict:
    """Our layer params (module docstring) from a layer's HF tensors `prefix + name` (numpy or
    torch-converted arrays; `prefix` e.g. "model.language_model.layers.0.linear_attn."). A shape
    that does not fit `cfg` is one ConfigError."""
    h, c, hv, vd, k = cfg.hidden, cfg.conv_dim, cfg.num_v_heads, cfg.value_dim, cfg.conv_kernel
    want = {"in_proj_qkv.weight": (c, h), "in_proj_z.weight": (vd, h), "in_proj_b.weight": (hv, h),
            "in_proj_a.weight": (hv, h), "conv1d.weight": (c, 1, k), "A_log": (hv,), "dt_bias": (hv,),
            "norm.weight": (cfg.head_v_dim,), "out_proj.weight": (h, vd)}
    w = {}
    for name, shape in want.items():
        if prefix + name not in weights:
            raise ConfigError(f"the checkpoint lacks {prefix + name}; is this a Qwen3.5 linear-attention layer?")
        w[name] = np.asarray(weights[prefix + name])
        if w[name].shape != shape:
            raise ConfigError(f"{prefix + name} has shape {list(w[name].shape)}; the config needs {list(shape)}")
    return {"qkv": w["in_proj_qkv.weight"].T, "z": w["in_proj_z.weight"].T, "b": w["in_proj_b.weight"].T,
            "a": w["in_proj_a.weight"].T, "conv": w["conv1d.weight"], "A_log": w["A_log"],
            "dt_bias": w["dt_bias"], "norm": w["norm.weight"], "out": w["out_proj.weight"].T}


def init_states(cfg: GdnConfig, batch: int, dtype) -> tuple[jax.Array, jax.Array]:
    """Zero states of `batch` sequences: conv_state [Bt, K-1, C] in `dtype`, rec_state [Bt, Hv, dk, dv] f32."""
    return (jnp.zeros((batch, cfg.conv_kernel - 1, cfg.conv_dim), dtype),
            jnp.zeros((batch, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim), jnp.float32))


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["inputs", "k", "v", "g", "beta", "w", "cum"],
    meta_fields=[],
)
@dataclasses.dataclass(frozen=True)
class TreeStates:
    """What `tree_verify` leaves for the commit, per node (no node's recurrent state). From the
    recurrent form (the deterministic mode, gdn_tree "recurrent") k and v are the conv's outputs
    as the kernel reads them (model dtype, k not normalised), and w and cum are None: that commit
    steps the path again."""

    inputs: jax.Array  # [Bt, N, C], model dtype: the node's conv input (the next windows' entry)
    k: jax.Array  # [Bt, N, Hk, dk] f32: L2-normalised key
    v: jax.Array  # [Bt, N, Hv, dv] f32
    g: jax.Array  # [Bt, N, Hv] f32: log decay
    beta: jax.Array  # [Bt, N, Hv] f32
    w: jax.Array | None  # [Bt, N, Hv, dv] f32: the delta written to the state (given the pre-round state)
    cum: jax.Array | None  # [Bt, N, Hv] f32: sum of g over the node's root path, itself included


# ----------------------------------------------------------------------------- per token

def fuse_params(p: dict) -> dict:
    """The inference layout: qkv, z, b and a in one matrix "in_proj" [H, C + Hv dv + 2 Hv] (they
    read the same x: one product instead of four, two of them only Hv columns wide)."""
    return fuse_layer_weights(p, {"in_proj": ("qkv", "z", "b", "a")})


def _project(p: dict, cfg: GdnConfig, x: jax.Array, kernels: KernelTuning):
    """x [..., H] -> the conv input u [..., C], z [..., Hv dv], b and a [..., Hv] (x's dtype)."""
    if "in_proj" in p:
        c, vd, hv = cfg.conv_dim, cfg.value_dim, cfg.num_v_heads
        return tuple(jnp.split(linear(x, p["in_proj"], kernels=kernels), [c, c + vd, c + vd + hv], axis=-1))
    return tuple(linear(x, p[name], kernels=kernels) for name in ("qkv", "z", "b", "a"))


def _conv(p: dict, window: list[jax.Array], dtype) -> jax.Array:
    """silu of the depthwise conv over K inputs [..., C] (oldest first), summed in f32 in one
    fixed order (so prefill, step and tree windows round alike)."""
    w = p["conv"][:, 0, :].astype(jnp.float32)  # [C, K]
    acc = window[0].astype(jnp.float32) * w[:, 0]
    for j in range(1, len(window)):
        acc = acc + window[j].astype(jnp.float32) * w[:, j]
    return jax.nn.silu(acc).astype(dtype)


def _l2norm(x: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + _L2_EPS)


def _heads(cfg: GdnConfig, c: jax.Array):
    """The conv output c [..., C] -> q, k [..., Hk, dk], v [..., Hv, dv] in c's dtype."""
    n, lead = cfg.qkv_groups, c.shape[:-1]
    kd = cfg.key_dim // n
    c = c.reshape(*lead, n, cfg.conv_dim // n)   # a block of heads a group
    return (c[..., :kd].reshape(*lead, cfg.num_k_heads, cfg.head_k_dim),
            c[..., kd:2 * kd].reshape(*lead, cfg.num_k_heads, cfg.head_k_dim),
            c[..., 2 * kd:].reshape(*lead, cfg.num_v_heads, cfg.head_v_dim))


def qkv_order(cfg: GdnConfig) -> np.ndarray:
    """The checkpoint's conv channel of each channel of `cfg.qkv_groups` blocks (module doc)."""
    n, kd, vd = cfg.qkv_groups, cfg.key_dim // cfg.qkv_groups, cfg.value_dim // cfg.qkv_groups
    return np.concatenate([np.concatenate([np.arange(i * kd, (i + 1) * kd),
                                           cfg.key_dim + np.arange(i * kd, (i + 1) * kd),
                                           2 * cfg.key_dim + np.arange(i * vd, (i + 1) * vd)]) for i in range(n)])


def group_qkv(p: dict, cfg: GdnConfig) -> dict:
    """A layer's params (unfused, on the host) with the conv channels in `cfg.qkv_groups` blocks:
    qkv's columns and conv's rows reordered."""
    order = qkv_order(cfg)
    return {**p, "qkv": np.asarray(p["qkv"])[:, order], "conv": np.asarray(p["conv"])[order]}


def _gates(p: dict, b: jax.Array, a: jax.Array):
    """b, a [..., Hv] -> the log decay g and beta [..., Hv] f32."""
    beta = jax.nn.sigmoid(b).astype(jnp.float32)  # in the model's dtype first, as transformers does
    g = -jnp.exp(p["A_log"].astype(jnp.float32)) * jax.nn.softplus(
        a.astype(jnp.float32) + p["dt_bias"].astype(jnp.float32))
    return g, beta


def _features(p: dict, cfg: GdnConfig, c: jax.Array, b: jax.Array, a: jax.Array):
    """The conv output c [..., C] and b, a [..., Hv] -> q, k [..., Hk, dk], v [..., Hv, dv],
    g, beta [..., Hv], all f32; q normalised and scaled, k normalised."""
    q, k, v = (x.astype(jnp.float32) for x in _heads(cfg, c))
    q = _l2norm(q) * cfg.head_k_dim**-0.5
    k = _l2norm(k)
    return (q, k, v, *_gates(p, b, a))


def _expand(x: jax.Array, cfg: GdnConfig) -> jax.Array:
    """[..., Hk, d] -> [..., Hv, d]: each key head repeated for its group of value heads."""
    return jnp.repeat(x, cfg.group, axis=-2) if cfg.group > 1 else x


def _output(p: dict, cfg: GdnConfig, o: jax.Array, z: jax.Array, dtype, kernels: KernelTuning) -> jax.Array:
    """The core output o [..., Hv, dv] f32 and the gate z [..., Hv dv] -> y [..., H] in `dtype`:
    transformers' Qwen3_5RMSNormGated (its casts included), then out_proj."""
    o = dispatch.rms_norm_casts(kernels, o.astype(dtype), p["norm"], cfg.rms_eps)
    gate = z.reshape(o.shape).astype(jnp.float32)
    o = (o.astype(jnp.float32) * jax.nn.silu(gate)).astype(dtype)
    return linear(o.reshape(*o.shape[:-2], cfg.value_dim), p["out"], kernels=kernels)


def _last_inputs(ext: jax.Array, n: jax.Array, kernel: int) -> jax.Array:
    """The conv state after n[Bt] of the inputs that follow the old state in ext [Bt, K-1+T, C]:
    ext[b, n[b] : n[b]+K-1]."""
    idx = n.astype(jnp.int32)[:, None] + jnp.arange(kernel - 1, dtype=jnp.int32)
    return jnp.take_along_axis(ext, idx[:, :, None], axis=1)


# ----------------------------------------------------------------------------- the delta rule
# Head-major inside: q, k [..., Hv, n, dk], v and deltas [..., Hv, n, dv], g / beta / cum [..., Hv, n].

def _delta_step(s: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array) -> jax.Array:
    """The recurrent form, one token: s [Bt, Hv, dk, dv]; k [Bt, Hv, dk]; v [Bt, Hv, dv]; g, beta [Bt, Hv]."""
    s = s * jnp.exp(g)[..., None, None]
    kv = jnp.einsum("bhk,bhkv->bhv", k, s, precision=_HI)
    delta = (v - kv) * beta[..., None]
    return s + k[..., :, None] * delta[..., None, :]


def _unit_lower_solve(lower, rhs):
    """X with (I + L) X = rhs, L the strictly lower part of lower [..., n, n] (its diagonal is read as ones)."""
    return jax.lax.linalg.triangular_solve(lower, rhs, left_side=True, lower=True, unit_diagonal=True)


def _intra(q, k, v, beta, cum, mask):
    """The state-free part of the parallel form over n tokens, where mask [..., n, n] says which
    tokens precede token i on its path (i itself included; a lower-triangular pattern).
    Returns attn [..., Hv, n, n] (q_i k_j exp(cum_i - cum_j) on the mask), and the triangular
    solve's two parts: the deltas' state-free part [..., Hv, n, dv] and the keys that read the
    initial state [..., Hv, n, dk]."""
    diff = cum[..., :, None] - cum[..., None, :]
    decay = jnp.exp(jnp.where(mask[..., None, :, :], diff, -jnp.inf))  # 0 off the path, before exp overflows
    kb = k * beta[..., None]
    lower = jnp.einsum("...id,...jd->...ij", kb, k, precision=_HI) * decay
    rhs = jnp.concatenate([v * beta[..., None], kb * jnp.exp(cum)[..., None]], axis=-1)
    sol = _unit_lower_solve(lower, rhs)
    attn = jnp.einsum("...id,...jd->...ij", q, k, precision=_HI) * decay
    dv = v.shape[-1]
    return attn, sol[..., :dv], sol[..., dv:]


def _inter(s, q, cum, attn, new_values, k_cumdecay):
    """The part that reads the initial state s [..., Hv, dk, dv]: outputs [..., Hv, n, dv] and the
    deltas w [..., Hv, n, dv] written to the state."""
    w = new_values - jnp.einsum("...ik,...kv->...iv", k_cumdecay, s, precision=_HI)
    o = jnp.einsum("...ik,...kv->...iv", q * jnp.exp(cum)[..., None], s, precision=_HI)
    return o + jnp.einsum("...ij,...jv->...iv", attn, w, precision=_HI), w


def _advance(s, k, w, cum, cum_end, live=None):
    """The state after the tokens j (those `live` [..., 1 or Hv, n], default all) of a path ending
    where the summed log decay is cum_end [..., Hv]: exp(cum_end) s + sum_j exp(cum_end - cum_j) k_j w_j^T."""
    diff = cum_end[..., None] - cum
    if live is not None:
        diff = jnp.where(live, diff, -jnp.inf)
    kw = k * jnp.exp(diff)[..., None]
    return s * jnp.exp(cum_end)[..., None, None] + jnp.einsum("...jk,...jv->...kv", kw, w, precision=_HI)


def _heads_first(x: jax.Array) -> jax.Array:
    """[Bt, T, Hv, ...] -> [Bt, Hv, T, ...]."""
    return jnp.moveaxis(x, 2, 1)


def _chunked(cfg: GdnConfig, q, k, v, g, beta, s):
    """The chunked form over T tokens (chunks of cfg.chunk): q, k [Bt, T, Hv, dk], v [Bt, T, Hv, dv],
    g, beta [Bt, T, Hv], s [Bt, Hv, dk, dv]. Returns o [Bt, T, Hv, dv] and the final state.
    Padding tokens have g = beta = 0: they leave the state as it is."""
    bt, t = q.shape[:2]
    c = min(cfg.chunk, t)  # a short prompt is one chunk of its own length, not padded to a full one
    pad = (-t) % c
    n = (t + pad) // c

    def chunks(x):  # [Bt, T, Hv, ...] -> [n, Bt, Hv, c, ...]
        x = _heads_first(jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)))
        x = x.reshape(*x.shape[:2], n, c, *x.shape[3:])
        return jnp.moveaxis(x, 2, 0)

    q, k, v, g, beta = map(chunks, (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)
    # every chunk's state-free part at once; only the state's pass runs chunk after chunk
    attn, new_values, k_cumdecay = _intra(q, k, v, beta, cum, jnp.tril(jnp.ones((c, c), bool)))

    def body(s, xs):
        qc, kc, cumc, attnc, nvc, kcdc = xs
        o, w = _inter(s, qc, cumc, attnc, nvc, kcdc)
        return _advance(s, kc, w, cumc, cumc[..., -1]), o

    s, o = jax.lax.scan(body, s, (q, k, cum, attn, new_values, k_cumdecay))
    o = jnp.moveaxis(o, 0, 2).reshape(bt, cfg.num_v_heads, n * c, -1)[:, :, :t]
    return _heads_first(o), s


# ----------------------------------------------------------------------------- the layer

def prefill(params: dict, cfg: GdnConfig, x: jax.Array, conv_state: jax.Array | None = None,
            rec_state: jax.Array | None = None, lengths: jax.Array | None = None, *,
            kernels: KernelTuning = XLA_KERNELS):
    """The layer over T new tokens of each row, the chunked form.

    x [Bt, T, H]; conv_state [Bt, K-1, C] and rec_state [Bt, Hv, dk, dv] f32 continue earlier
    tokens (None: zeros, a sequence's start). lengths int32 [Bt] in 0..T (None: T): row b's
    tokens from lengths[b] on are right padding; they leave the states as they are, and their
    outputs are not meaningful. Returns y [Bt, T, H] (x's dtype), the conv state and the recurrent state.
    """
    bt, t, _ = x.shape
    if conv_state is None or rec_state is None:
        zc, zr = init_states(cfg, bt, x.dtype)
        conv_state = zc if conv_state is None else conv_state
        rec_state = zr if rec_state is None else rec_state
    u, z, b, a = _project(params, cfg, x, kernels)
    ext = jnp.concatenate([conv_state.astype(u.dtype), u], axis=1)
    kernel = cfg.conv_kernel
    c = _conv(params, [ext[:, j:j + t] for j in range(kernel)], u.dtype)
    q, k, v, g, beta = _features(params, cfg, c, b, a)
    if lengths is None:
        conv_state = ext[:, t:]
    else:
        live = (jnp.arange(t) < lengths[:, None])[..., None]
        g, beta = jnp.where(live, g, 0.0), jnp.where(live, beta, 0.0)
        conv_state = _last_inputs(ext, lengths, kernel)
    o, rec_state = _chunked(cfg, _expand(q, cfg), _expand(k, cfg), v, g, beta, rec_state.astype(jnp.float32))
    return _output(params, cfg, o, z, x.dtype, kernels), conv_state, rec_state


def step(params: dict, cfg: GdnConfig, x_t: jax.Array, conv_state: jax.Array, rec_state: jax.Array, *,
         kernels: KernelTuning = XLA_KERNELS):
    """One token of each row, the recurrent form: x_t [Bt, H]; conv_state [Bt, K-1, C];
    rec_state [Bt, Hv, dk, dv] f32. Returns y_t [Bt, H] and both states advanced."""
    u, z, b, a = _project(params, cfg, x_t, kernels)
    ext = jnp.concatenate([conv_state.astype(u.dtype), u[:, None]], axis=1)  # [Bt, K, C]
    c = _conv(params, [ext[:, j] for j in range(cfg.conv_kernel)], u.dtype)
    if kernels.deterministic:  # a one-node tree through the kernel that verifies trees
        root = jnp.zeros((x_t.shape[0], 1), jnp.int32)    # node 0, at depth 0
        o, states = dispatch.gdn_recurrence(kernels, *(x[:, None] for x in (*_heads(cfg, c), *_gates(params, b, a))),
                                            root, root, rec_state)
        return _output(params, cfg, o[:, 0], z, x_t.dtype, kernels), ext[:, 1:], states[:, :, 0]
    q, k, v, g, beta = _features(params, cfg, c, b, a)
    s = _delta_step(rec_state.astype(jnp.float32), _expand(k, cfg), v, g, beta)
    o = jnp.einsum("bhk,bhkv->bhv", _expand(q, cfg), s, precision=_HI)
    return _output(params, cfg, o, z, x_t.dtype, kernels), ext[:, 1:], s


def _ancestors(parents: jax.Array) -> jax.Array:
    """bool [Bt, N, N]: [b, i, j] = j is i or an ancestor of i (the models do not import the tree
    policies; the engine passes its DraftTree's mask)."""
    n = parents.shape[-1]
    ids = jnp.arange(n, dtype=jnp.int32)
    up = jnp.broadcast_to(ids, parents.shape)
    mask = up[..., :, None] == ids
    for _ in range(n - 1):  # a node is at most n - 1 generations below the root
        up = jnp.where(up >= 0, jnp.take_along_axis(parents, jnp.maximum(up, 0), axis=-1), -1)
        mask = mask | (up[..., :, None] == ids)
    return mask


def tree_verify(params: dict, cfg: GdnConfig, x_nodes: jax.Array, parents: jax.Array, conv_state: jax.Array,
                rec_state: jax.Array, ancestor_mask: jax.Array | None = None, walk=None, *,
                kernels: KernelTuning = XLA_KERNELS):
    """The layer over a tree of N nodes a row, in one pass (the parallel form; module docstring).

    x_nodes [Bt, N, H]; parents int32 [Bt, N]: node 0 the root (parent -1), every parent before
    its child (a padding node: parent 0). conv_state, rec_state: the pre-round states (after the
    committed tokens; the root is not in them). ancestor_mask bool [Bt, N, N] ([b, i, j]: j is i
    or an ancestor of i; the engine's DraftTree.ancestor_mask), derived from parents where None.
    walk: the recurrent form's (order, depth) of the nodes (gdn_recurrence.preorder), derived
    where None: a forward makes it once for all its layers.
    Returns y [Bt, N, H], node i's output being the layer's on the pre-round sequence followed by
    i's root path, and the TreeStates a commit reads (`path_states`, `path_states_parallel`).
    """
    bt, n, _ = x_nodes.shape
    kernel = cfg.conv_kernel
    if ancestor_mask is None:
        ancestor_mask = _ancestors(parents)
    u, z, b, a = _project(params, cfg, x_nodes, kernels)
    ext = jnp.concatenate([conv_state.astype(u.dtype), u], axis=1)  # [Bt, K-1+N, C]
    # each entry's predecessor in a window: a node's parent, the root's the newest state entry
    older = jnp.broadcast_to(jnp.maximum(jnp.arange(kernel - 1, dtype=jnp.int32) - 1, 0), (bt, kernel - 1))
    pred = jnp.concatenate([older, jnp.where(parents >= 0, parents + kernel - 1, kernel - 2)], axis=1)
    rows = [jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32) + kernel - 1, (bt, n))]
    for _ in range(kernel - 1):
        rows.append(jnp.take_along_axis(pred, rows[-1], axis=1))
    c = _conv(params, [jnp.take_along_axis(ext, r[:, :, None], axis=1) for r in reversed(rows)], u.dtype)
    if kernels.gdn_recurrent:  # each node a step from its parent's state
        q, k, v = _heads(cfg, c)
        g, beta = _gates(params, b, a)
        walk = preorder(parents, ancestor_mask) if walk is None else walk
        o, _ = dispatch.gdn_recurrence(kernels, q, k, v, g, beta, *walk, rec_state)
        y = _output(params, cfg, o, z, x_nodes.dtype, kernels)
        return y, TreeStates(inputs=u, k=k, v=v, g=g, beta=beta, w=None, cum=None)
    q, k, v, g, beta = _features(params, cfg, c, b, a)
    cum = jnp.einsum("bij,bjh->bih", ancestor_mask.astype(jnp.float32), g, precision=_HI)
    qh, kh, vh = (_heads_first(t) for t in (_expand(q, cfg), _expand(k, cfg), v))
    cumh, betah = _heads_first(cum), _heads_first(beta)
    attn, new_values, k_cumdecay = _intra(qh, kh, vh, betah, cumh, ancestor_mask)
    o, w = _inter(rec_state.astype(jnp.float32), qh, cumh, attn, new_values, k_cumdecay)
    y = _output(params, cfg, _heads_first(o), z, x_nodes.dtype, kernels)
    return y, TreeStates(inputs=u, k=k, v=v, g=g, beta=beta, w=_heads_first(w), cum=cum)


def _gather_path(x: jax.Array, path: jax.Array) -> jax.Array:
    """x [Bt, N, ...] at the path's nodes path [Bt, P] -> [Bt, P, ...]."""
    idx = path.astype(jnp.int32).reshape(*path.shape, *([1] * (x.ndim - 2)))
    return jnp.take_along_axis(x, idx, axis=1)


def path_states(cfg: GdnConfig, tree: TreeStates, path: jax.Array, path_len: jax.Array, conv_state: jax.Array,
                rec_state: jax.Array):
    """The states after an accepted path, recomputed sequentially (the recurrent form, as `step`).

    tree: tree_verify's TreeStates; path int32 [Bt, P] (P = D+1): the accepted nodes from the root
    (the walk's path; entries past path_len anything valid); path_len int32 [Bt] >= 1: how many of
    them to take (accepted nodes + the root). conv_state, rec_state: the pre-round states given to
    tree_verify. Returns (conv_state [Bt, K-1, C], rec_state [Bt, Hv, dk, dv] f32). P steps in sequence.
    """
    ext = jnp.concatenate([conv_state.astype(tree.inputs.dtype), _gather_path(tree.inputs, path)], axis=1)
    conv_state = _last_inputs(ext, path_len, cfg.conv_kernel)
    k, v, g, beta = (jnp.moveaxis(_gather_path(x, path), 1, 0) for x in (tree.k, tree.v, tree.g, tree.beta))
    live = jnp.arange(path.shape[1])[:, None] < path_len[None, :]  # [P, Bt]

    def body(s, xs):
        kd, vd, gd, bd, on = xs
        return jnp.where(on[:, None, None, None], _delta_step(s, _expand(kd, cfg), vd, gd, bd), s), None

    s, _ = jax.lax.scan(body, rec_state.astype(jnp.float32), (k, v, g, beta, live))
    return conv_state, s


def path_states_parallel(cfg: GdnConfig, tree: TreeStates, path: jax.Array, path_len: jax.Array,
                         conv_state: jax.Array, rec_state: jax.Array):
    """`path_states` in closed form: S = exp(G_end) S0 + sum_j exp(G_end - G_j) k_j w_j^T over the
    path's nodes j (module docstring); one masked product, no sequence. Same arguments and
    result; equal to `path_states` up to float32 rounding. rec_state must be the one tree_verify
    was given (the deltas w were computed against it)."""
    ext = jnp.concatenate([conv_state.astype(tree.inputs.dtype), _gather_path(tree.inputs, path)], axis=1)
    conv_state = _last_inputs(ext, path_len, cfg.conv_kernel)
    k, w, cum = (_heads_first(_gather_path(x, path)) for x in (_expand(tree.k, cfg), tree.w, tree.cum))
    last = jnp.take_along_axis(path, (path_len - 1)[:, None], axis=1)[:, 0]
    cum_end = jnp.take_along_axis(tree.cum, last[:, None, None], axis=1)[:, 0]  # [Bt, Hv]
    live = (jnp.arange(path.shape[1]) < path_len[:, None])[:, None, :]  # [Bt, 1, P]
    return conv_state, _advance(rec_state.astype(jnp.float32), k, w, cum, cum_end, live)


def path_states_recurrent(cfg: GdnConfig, tree: TreeStates, path: jax.Array, path_len: jax.Array,
                          conv_state: jax.Array, rec_state: jax.Array, *, kernels: KernelTuning):
    """`path_states` for a recurrent verify's TreeStates (w None: the deterministic mode's, or
    gdn_tree "recurrent"): the path stepped again as a chain through the verify's kernel; in the
    deterministic mode bit for bit what decoding its tokens leaves. Same arguments and result as
    `path_states`."""
    ext = jnp.concatenate([conv_state.astype(tree.inputs.dtype), _gather_path(tree.inputs, path)], axis=1)
    conv_state = _last_inputs(ext, path_len, cfg.conv_kernel)
    k, v, g, beta = (_gather_path(x, path) for x in (tree.k, tree.v, tree.g, tree.beta))
    chain = jnp.broadcast_to(jnp.arange(path.shape[1], dtype=jnp.int32), path.shape)   # node d at depth d
    _, states = dispatch.gdn_recurrence(kernels, None, k, v, g, beta, chain, chain, rec_state)  # states only
    last = (path_len - 1).astype(jnp.int32).reshape(-1, 1, 1, 1, 1)
    return conv_state, jnp.take_along_axis(states, last, axis=2)[:, :, 0]
