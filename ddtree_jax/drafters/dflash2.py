"""The DFlash 2 drafter (z-lab's `DFlash2DraftModel`) as pure functions.

DFlash 2 is the DFlash drafter (drafters/dflash.py: context features, cached context K/V,
non-causal attention over the noise block) with two additions, both carried by the checkpoint:

  * a grouped dynamic causal convolution around each attention and each MLP sublayer:
        h = input_layernorm(x);   h, d = prepare(h);   x = x + finish(o_proj(attn(h)), d)
        h = post_attention_layernorm(x);  h, d = prepare(h);  x = x + finish(mlp(h), d)
    where prepare(h) = (conv(h, d0, base[0]), d1) with [d0 | d1] = kernel_projection(h) viewed
    [T, 2, taps, G], finish(y, d1) = conv(y, d1, base[1]), and
        conv(x, d, base)[t, c] = sum_k (base[k, c] + d[t, k, c // group]) * x[t - k, c],
    x before the block's first row being 0 (the convolution never reaches into the context).
  * a candidate selector over the target head's top-K per block position (the logits first
    scaled by `output_multiplier` and soft-capped by `final_logit_softcapping`, both optional):
        score[d, p, c] = unary[d, c] + < pred[prev_p] * proj(h_d), succ[cand_c] >
    prev being position d-1's candidates (the root, the verified anchor, at d = 0). Its draft is a
    walk from the root, each step the best candidate given the one chosen before (greedy), or a
    draw from softmax(score / T) of that row (sampling), whose probabilities are the proposal q.

`draft_logp` hands the engine what its tree stage reads: per block position the selector's
log-probabilities over its K candidates, conditioned on the greedy walk's choice at the position
before (the q z-lab's and vLLM's DFlash 2 report along their path, at temperature 1), and
`OUTSIDE` on every other token. A chain over them is the selector's greedy path; any tree over
them stays lossless (the target verifies every node; sampling draws the target's own token).

Param layout: DFlash's (dflash.py; names.py: "fc", "hidden_norm", "norm", "layers") plus
    per layer: "attn_conv_base", "mlp_conv_base": [2, taps, H] (prepare's, then finish's kernel)
               "attn_conv_kernel", "mlp_conv_kernel": [H, 2 * taps * G] (kernel_projection, [in, out])
    top:       "selector_pred", "selector_succ": [V, R] (the codebooks), "selector_proj": [H, R]
H hidden, G = H / conv_group_size, R selector_rank, K selector_top_k, D = block_size - 1.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ddtree_jax.drafters import dflash
from ddtree_jax.errors import ConfigError
from ddtree_jax.kernels import dispatch
from ddtree_jax.models.config import DrafterConfig, _Fields
from ddtree_jax.models.family import family_of
from ddtree_jax.models.layers import KVCache, final_norm, layer_view, linear, mlp, rope_tables
from ddtree_jax.tuning import CPU_KERNELS, KernelTuning

ARCHITECTURE = "DFlash2DraftModel"
# dflash_config keys that only DFlash 2 has: each one required of a DFlash 2 config.
REQUIRED_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# Log-probability of a token outside the selector's candidates: finite (sums stay finite, as
# trees.base's path_logp needs), below any candidate's.
OUTSIDE = -1e30


@dataclasses.dataclass(frozen=True, kw_only=True)
class DFlash2Config(DrafterConfig):
    """A DFlash 2 drafter: DFlash's fields, its convolution's and its selector's."""

    conv_kernel_size: int  # taps of each convolution
    conv_group_size: int  # channels sharing one dynamic coefficient
    selector_rank: int
    selector_top_k: int
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None  # None: no soft cap

    architecture = ARCHITECTURE

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    @staticmethod
    def from_hf(d: dict[str, Any], where: str = "drafter config.json") -> "DFlash2Config":
        """The drafter a z-lab DFlash 2 config.json describes. DFlash's fields as DrafterConfig
        reads them; DFlash 2's from `dflash_config`, else the top level (z-lab's reference reads
        both); all four of REQUIRED_KEYS or one ConfigError naming the missing ones."""
        f = _Fields(d, where)
        dfc = f.sub("dflash_config")
        need = "conv_kernel_size, conv_group_size, selector_rank and selector_top_k in its dflash_config"
        if dfc is None:
            raise ConfigError(f"{where} lacks the field 'dflash_config'; a DFlash 2 drafter ({ARCHITECTURE}) "
                              f"needs {need}")
        missing = [k for k in REQUIRED_KEYS if dfc.d.get(k) is None and d.get(k) is None]
        if missing:
            raise ConfigError(f"{where}: dflash_config lacks {', '.join(repr(k) for k in missing)}; a DFlash 2 "
                              f"drafter ({ARCHITECTURE}) needs {need}")
        base = DrafterConfig.from_hf(d, where)

        def pick(key: str) -> _Fields:  # dflash_config's value where it has one, else the top level's
            return dfc if dfc.d.get(key) is not None else f

        ints = {k: pick(k).integer(k) for k in REQUIRED_KEYS}
        if base.hidden_size % ints["conv_group_size"]:
            raise ConfigError(f"{where}: conv_group_size {ints['conv_group_size']} does not divide hidden_size "
                              f"{base.hidden_size}; the convolution shares one coefficient per group of channels")
        if ints["selector_top_k"] > base.vocab_size:
            raise ConfigError(f"{where}: selector_top_k {ints['selector_top_k']} is more than vocab_size "
                              f"{base.vocab_size}")
        scale = pick("input_embedding_scale").number("input_embedding_scale", 1.0, nullable=True)
        mult = pick("output_multiplier").number("output_multiplier", 1.0, nullable=True)
        cap_src = pick("final_logit_softcapping")
        cap = cap_src.d.get("final_logit_softcapping")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or cap != cap):
            raise cap_src.bad("final_logit_softcapping", cap, "a number (> 0 caps the logits) or null")
        return DFlash2Config(**{fld.name: getattr(base, fld.name) for fld in dataclasses.fields(DrafterConfig)},
                             **ints, input_embedding_scale=scale, output_multiplier=mult,
                             final_logit_softcapping=float(cap) if cap is not None and cap > 0 else None)


def is_dflash2(d: Any) -> bool:
    """Whether a drafter config.json (its JSON) is DFlash 2's: its architecture, or any key of
    REQUIRED_KEYS in dflash_config (never run as DFlash: its tensors and its draft differ)."""
    if not isinstance(d, dict):
        return False
    archs = d.get("architectures")
    if isinstance(archs, list) and ARCHITECTURE in archs:
        return True
    dfc = d.get("dflash_config")
    return isinstance(dfc, dict) and any(dfc.get(k) is not None for k in REQUIRED_KEYS)


def drafter_config_from_hf(d: dict[str, Any], where: str = "drafter config.json") -> DrafterConfig:
    """A drafter's config: DFlash2Config for a DFlash 2 config.json (`is_dflash2`), else DFlash's."""
    return DFlash2Config.from_hf(d, where) if is_dflash2(d) else DrafterConfig.from_hf(d, where)


# ----------------------------------------------------------------------------- the convolution


def grouped_conv(x: jax.Array, delta: jax.Array, base: jax.Array, group_size: int) -> jax.Array:
    """conv(x, delta, base) of the module docstring over the block's rows.

    x [..., T, H] (T rows from the block's first), delta [..., T, taps, G], base [taps, H]:
    out[t, c] = sum_k (base[k, c] + delta[t, k, c // group_size]) * x[t - k, c], with x[t - k] = 0
    for t < k. Computed in float32, returned in x's dtype."""
    t, h = x.shape[-2:]
    taps = base.shape[0]
    xf = x.astype(jnp.float32)
    dyn = jnp.repeat(delta.astype(jnp.float32), group_size, axis=-1)  # [..., T, taps, H]
    out = jnp.zeros_like(xf)
    for k in range(min(taps, t)):  # a tap k >= T reaches before the block only: zero
        shifted = xf if k == 0 else jnp.pad(xf[..., : t - k, :], [(0, 0)] * (xf.ndim - 2) + [(k, 0), (0, 0)])
        out = out + (base[k].astype(jnp.float32) + dyn[..., k, :]) * shifted
    return out.astype(x.dtype)


def conv_prepare(p: dict, name: str, cfg: DFlash2Config, h: jax.Array, *,
                 kernels: KernelTuning = CPU_KERNELS) -> tuple[jax.Array, jax.Array]:
    """Convolution `name` ("attn_conv" or "mlp_conv") before its sublayer: (conv(h, d0, base[0]),
    d1), [d0 | d1] from one projection of h [..., T, H]; d1 [..., T, taps, G] is finish's."""
    taps, groups = cfg.conv_kernel_size, cfg.conv_groups
    d = linear(h, p[f"{name}_kernel"], kernels=kernels).reshape(*h.shape[:-1], 2, taps, groups)
    return grouped_conv(h, d[..., 0, :, :], p[f"{name}_base"][0], cfg.conv_group_size), d[..., 1, :, :]


def conv_finish(p: dict, name: str, cfg: DFlash2Config, y: jax.Array, d1: jax.Array) -> jax.Array:
    """Convolution `name` after its sublayer: conv(y, d1, base[1])."""
    return grouped_conv(y, d1, p[f"{name}_base"][1], cfg.conv_group_size)


# ----------------------------------------------------------------------------- the layers


def draft_hidden(
    dparams: dict, cfg: DFlash2Config, block_embeds: jax.Array, block_positions: jax.Array, cache: KVCache,
    cache_len: jax.Array, *, kernels: KernelTuning = CPU_KERNELS,
) -> jax.Array:
    """One pass over the noise block; final-normed hidden [Bt, bs, H].

    block_embeds: the target's embeddings of [root, MASK x (bs-1)] (input_embedding_scale is
    applied here); the block sees the cached context [0, cache_len) as dflash.draft_hidden's does
    (the context K/V are DFlash's: dflash.extend_cache), itself in full or, in a causal layer,
    causally. Either param layout (names.py's, or dflash.fuse_params').
    """
    bt, bs, _ = block_embeds.shape
    x = block_embeds
    if cfg.input_embedding_scale != 1.0:
        x = x * jnp.asarray(cfg.input_embedding_scale, x.dtype)
    cos, sin = rope_tables(block_positions, cfg.rope, cfg.head_dim)
    full = jnp.ones((bt, bs, bs), bool)
    tril = jnp.broadcast_to(jnp.tril(jnp.ones((bs, bs), bool)), (bt, bs, bs))
    scale = cfg.head_dim**-0.5
    causal = cfg.causal or (False,) * cfg.num_layers
    for i in range(cfg.num_layers):
        p = layer_view(dparams, i)
        with jax.named_scope(f"draft2_layer{i}"):
            h = dispatch.rms_norm(kernels, x, p["attn_norm"], cfg.rms_eps)
            h, d1 = conv_prepare(p, "attn_conv", cfg, h, kernels=kernels)
            q, k, v = dflash.block_qkv_normed(p, cfg, h, cos, sin, kernels=kernels)
            window = cfg.sliding_windows[i]
            kv_start = None if window is None else jnp.maximum(cache_len + bs - window, 0)
            o = dispatch.attention(kernels, q, k, v, cache.k, cache.v, cache_len, tril if causal[i] else full,
                                   scale=scale, kv_start=kv_start, layer=i)
            o = linear(o.reshape(bt, bs, -1), p["o"], p.get("o_bias"), kernels=kernels)
            x = x + conv_finish(p, "attn_conv", cfg, o, d1)
            h = dispatch.rms_norm(kernels, x, p["mlp_norm"], cfg.rms_eps)
            h, d1 = conv_prepare(p, "mlp_conv", cfg, h, kernels=kernels)
            x = x + conv_finish(p, "mlp_conv", cfg, mlp(p, h, kernels=kernels), d1)
    return dispatch.rms_norm(kernels, x, final_norm(dparams), cfg.rms_eps)


# ----------------------------------------------------------------------------- the selector


class Selection(NamedTuple):
    """The selector over one block. Shapes: Bt rows, D positions, K candidates."""

    candidates: jax.Array  # int32 [Bt, D, K]: indices into the head's columns, best unary first
    unary: jax.Array  # f32 [Bt, D, K]: their (scaled, capped) logits
    scores: jax.Array  # f32 [Bt, D, K, K]: [d, p, c], c after position d-1's candidate p (d = 0: the root, every p)
    path: jax.Array  # int32 [Bt, D]: the greedy walk's candidate index at each position
    logq: jax.Array  # f32 [Bt, D, K]: log softmax of the score row the walk reads at each position


def candidate_logits(logits: jax.Array, cfg: DFlash2Config) -> jax.Array:
    """The head's logits as the selector ranks them: x output_multiplier, then soft-capped."""
    x = logits.astype(jnp.float32)
    if cfg.output_multiplier != 1.0:
        x = x * cfg.output_multiplier
    if cfg.final_logit_softcapping is not None:
        x = jnp.tanh(x / cfg.final_logit_softcapping) * cfg.final_logit_softcapping
    return x


def select(dparams: dict, cfg: DFlash2Config, hidden: jax.Array, logits: jax.Array, anchor: jax.Array,
           vocab: jax.Array | None = None, *, kernels: KernelTuning = CPU_KERNELS) -> Selection:
    """The selector's candidates, scores and greedy walk for one block.

    hidden [Bt, D, H]: the final-normed states of the block's positions after the root;
    logits [Bt, D, V']: the head over them (V' = V, or a token map's columns, `vocab` [V'] their
    token ids); anchor int32 [Bt]: the root's token. Candidates are ties-to-lower-column top-K
    (lax.top_k) and the walk's argmax takes the first of equal scores; products in float32."""
    x = candidate_logits(logits, cfg)
    k = min(cfg.selector_top_k, x.shape[-1])
    unary, cand = jax.lax.top_k(x, k)  # [Bt, D, K]
    tokens = cand if vocab is None else jnp.take(vocab, cand, axis=0)
    bt, d = cand.shape[:2]
    proj = linear(hidden, dparams["selector_proj"], kernels=kernels).astype(jnp.float32)  # [Bt, D, R]
    prev = jnp.concatenate([jnp.broadcast_to(anchor[:, None, None], (bt, 1, k)), tokens[:, :-1]], axis=1)
    pred = jnp.take(dparams["selector_pred"], prev, axis=0).astype(jnp.float32)  # [Bt, D, K, R]
    succ = jnp.take(dparams["selector_succ"], tokens, axis=0).astype(jnp.float32)  # [Bt, D, K, R]
    edge = jnp.einsum("bdpr,bdr,bdcr->bdpc", pred, proj, succ, precision=jax.lax.Precision.HIGHEST)
    scores = unary[:, :, None, :] + edge
    rows, path = [], []
    at = jnp.zeros((bt,), jnp.int32)  # at d = 0 every row p holds the root's scores: take row 0
    for i in range(d):
        row = jnp.take_along_axis(scores[:, i], at[:, None, None], axis=1)[:, 0]  # [Bt, K]
        at = jnp.argmax(row, axis=-1).astype(jnp.int32)
        rows.append(row)
        path.append(at)
    logq = jax.nn.log_softmax(jnp.stack(rows, axis=1), axis=-1)
    return Selection(cand.astype(jnp.int32), unary, scores, jnp.stack(path, axis=1), logq)


def selection_logp(sel: Selection, vocab_size: int) -> jax.Array:
    """f32 [Bt, D, V']: sel.logq at each position's candidates, OUTSIDE elsewhere."""
    bt, d, _ = sel.candidates.shape
    out = jnp.full((bt, d, vocab_size), OUTSIDE, jnp.float32)
    b = jnp.arange(bt)[:, None, None]
    i = jnp.arange(d)[None, :, None]
    return out.at[b, i, sel.candidates].set(sel.logq)


def path_tokens(sel: Selection, vocab: jax.Array | None = None) -> jax.Array:
    """int32 [Bt, D]: the greedy walk's tokens (the DFlash 2 draft at temperature 0)."""
    cols = jnp.take_along_axis(sel.candidates, sel.path[..., None], axis=-1)[..., 0]
    return cols if vocab is None else jnp.take(vocab, cols, axis=0)


def draft_logp(dparams: dict, cfg: DFlash2Config, block_embeds: jax.Array, block_positions: jax.Array,
               cache: KVCache, cache_len: jax.Array, anchor: jax.Array, head: Callable[[jax.Array], jax.Array], *,
               kernels: KernelTuning = CPU_KERNELS) -> jax.Array:
    """The draft stage's log-probs [Bt, D, V'] (module docstring): `draft_hidden`, the head
    (`head`: final-normed states [..., H] -> float32 logits [..., V']; V' the columns of a token
    map, dparams["draft_vocab"], where the drafter has one), `select`, `selection_logp`."""
    h = draft_hidden(dparams, cfg, block_embeds, block_positions, cache, cache_len, kernels=kernels)[:, 1:]
    with jax.named_scope("draft2_select"):
        logits = head(h)
        sel = select(dparams, cfg, h, logits, anchor, dparams.get("draft_vocab"), kernels=kernels)
        return selection_logp(sel, logits.shape[-1])


def draft_stage(tparams: dict, dparams: dict, block: jax.Array, positions: jax.Array, cache: KVCache,
                cache_len: jax.Array, *, tcfg, dcfg: DFlash2Config, kernels: KernelTuning) -> jax.Array:
    """engine.draft_stage for a DFlash 2 drafter: `draft_logp` of block int32 [Bt, bs] ([root,
    MASK x D]) at positions [Bt, bs], the head being the drafter's own copy where it has one
    (quantized, or a token map's columns), else the target's; float32 [Bt, D, V']."""
    fam = family_of(tcfg)

    def head(h):
        if "lm_head" in dparams:
            return dispatch.matmul(kernels, h, dparams["lm_head"], out_dtype=jnp.float32)
        return fam.lm_head(tparams, tcfg, h, kernels=kernels)

    return draft_logp(dparams, dcfg, fam.embed(tparams, block), positions, cache, cache_len, block[:, 0], head,
                      kernels=kernels)
