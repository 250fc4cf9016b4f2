"""RMSNorm, residual add + RMSNorm, and per-head q/k RMSNorm + RoPE as single Pallas kernels.

Why: at batch 1 a decoder layer is launch-bound beyond its GEMMs. XLA on the H200 runs each
residual add, each norm's reduction and its multiply, and the per-head q/k norm and RoPE as
separate ~1.5 us kernels (six for the two add + norm pairs alone, of ~22 kernels a layer). Here a residual add and the norm after it
are one kernel with two outputs, and the split of the fused qkv projection into heads, the q/k
norms, RoPE and the v copy are one kernel with three outputs.

Numerics are those of ``ddtree_jax.models.layers`` (Hugging Face's Qwen3/Llama RMSNorm and
rotate-half RoPE): the mean of squares in float32, the normalised row cast to the activation
dtype *before* the weight multiply, the residual add in the activation dtype, RoPE in float32
and cast back. The ``*_reference`` functions below are the XLA path and spell the same math
out (models may not be imported from here: kernels <- models).

Blocking (Triton lowering, as in tree_attention.py: block shapes are powers of two):

* Norms: rows are the flattened leading dims. A program holds a whole row (the hidden size
  padded up to a power of two, masked loads and stores), and as many rows as make a tile of
  about 4096 elements: one row of H = 4096, so T = 1..16 gets one program per row, spread over
  as many SMs (the latency of one row, not of T rows); narrow rows are grouped, so tiny hidden
  sizes do not launch a program per row.
* q/k norm + RoPE: one program per block of tokens (one token of the Qwen3-8B shape: 32 q
  heads + 8 k + 8 v heads of 128), q/k heads as [tokens, heads, Dh/2] tiles: the two RoPE
  halves are loaded separately, so rotate-half needs no in-register shuffle. Head counts need
  not be powers of two (masked), the head dim must be (>= 4).

What the kernels cannot take (`norm_unsupported`, `qk_unsupported`; an explicit Pallas impl
raises, dispatch's "auto" takes XLA's path): a head dim that is not a power of two, a hidden size
above 16384 (a row would not fit one program's registers), empty inputs.

Weights: each call takes ``layer=None`` and a one-layer weight ([H], [Dh]), or ``layer`` and the
weight of every layer stacked ([L, H], [L, Dh]; ddtree_jax/kernels/stacking.py): a jitted call pays
host time for each buffer it takes (~2.7 us a weight on the H200), and a model has four norm
weights a layer, so they travel as four stacked arrays. The layer is an int32[1] kernel input
read at run time, so every layer of a forward calls one compiled kernel (a static index would
compile one a layer), and the kernel reads its row of the stack in place (a sliced operand
would be a copy). A traced layer is clamped into [0, L) as XLA's dynamic index is; a Python
int out of range is an error. A weight may also be a ``StackedRow(stacked, layer)`` (what the
models pass, stacking.py), with no ``layer``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

from .stacking import as_stack, check_layer, clamp_layer, layer_index, one_layer, split_row

try:  # The Triton lowering is deprecated in jax 0.11 and may disappear later.
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover - depends on the installed jax
    pltriton = None

__all__ = [
    "rms_norm", "add_rms_norm", "qk_norm_rope", "norm_unsupported", "qk_unsupported", "IMPLS",
    "rms_norm_reference", "add_rms_norm_reference", "qk_norm_rope_reference",
]

IMPLS = ("xla", "pallas", "triton", "pallas_interpret")
_TILE = 4096          # elements per program that the blocking aims at (one 8B-shape row)
_MAX_HIDDEN = 16384   # widest row one program holds


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _num_warps(tile: int) -> int:
    # Untuned: ~16 elements per thread, as Triton's layer-norm tutorial does (bench to refine).
    return min(8, _pow2_at_least(max(1, tile // 512)))


def _resolve(impl: str, why_not: str | None) -> str:
    """The path this call takes: xla, pallas or pallas_interpret. Pallas on shapes the kernels
    cannot take raises (dispatch's "auto" asks `norm_unsupported` / `qk_unsupported` first)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown norm impl {impl!r}; choose one of {IMPLS} "
                         "(\"auto\" is chosen per device by ddtree_jax.kernels.dispatch)")
    if impl == "triton":
        impl = "pallas"
    if impl != "xla" and why_not:
        raise ValueError(f"the Pallas norm kernels cannot take these shapes: {why_not}; "
                         "use impl='xla' (or 'auto' through dispatch)")
    if impl == "pallas" and pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton);"
                           " use impl='xla'")
    return impl


def _weight(w, layer, width: int, what: str) -> tuple[jax.Array, object]:
    """(weight, layer) of a call's weight argument (a StackedRow carries its layer), checked: with
    a layer, the weight must be the stacked [L, width] and a static layer index a row of it."""
    w, layer = split_row(w, layer)
    if layer is None:
        return w, None
    if jnp.ndim(w) != 2 or w.shape[1] != width:
        raise ValueError(f"with a layer, the {what} weight must be every layer's stacked [L, {width}]; "
                         f"got {jnp.shape(w)}")
    check_layer(layer, w.shape[0], f"layer {layer} is out of range for {w.shape[0]} stacked {what} weights")
    return w, layer


def _layer_rows(layer_ref, *n_layers: int):
    """The row a program reads of each stack (of n_layers[i] rows): the run-time layer, read
    once and clamped into [0, L) (as XLA's dynamic index clamps one past the end) so that no
    load leaves the stack; a stack of one needs no load."""
    layer = layer_ref[()] if max(n_layers, default=1) > 1 else None
    return [jnp.int32(0) if n == 1 else clamp_layer(layer, n) for n in n_layers]


def _compiler_params(interpret: bool, tile: int):
    if pltriton is None or interpret:
        return None
    return pltriton.CompilerParams(num_warps=_num_warps(tile), num_stages=1)


# ----------------------------------------------------------------------------- references

def rms_norm_reference(x: jax.Array, w: jax.Array, eps: float, *, layer=None, unit_offset: bool = False) -> jax.Array:
    """The XLA path of :func:`rms_norm` (layers.rms_norm's math); layer: w is stacked [L, H];
    unit_offset: Qwen3.5's form, the weight read as 1 + w and multiplied in float32 before the cast."""
    w = one_layer(w, layer)
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    if unit_offset:
        return (y * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
    return w.astype(x.dtype) * y.astype(x.dtype)


def add_rms_norm_reference(x, delta, w, eps, *, layer=None):
    s = x + delta
    return s, rms_norm_reference(s, w, eps, layer=layer)


def _rope_reference(x, cos, sin):
    """x [..., H, Dh]; cos/sin [..., Dh] float32 (HF's rotate-half layout)."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rot = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[..., None, :] + rot * sin[..., None, :]).astype(x.dtype)


def qk_norm_rope_reference(qkv, q_norm_w, k_norm_w, cos, sin, *, num_heads: int,
                           num_kv_heads: int, head_dim: int, eps: float, layer=None):
    """The XLA path of :func:`qk_norm_rope` (target._qkv's math)."""
    q_norm_w, k_norm_w = (None if w is None else one_layer(w, layer) for w in (q_norm_w, k_norm_w))
    nq, nkv = num_heads * head_dim, num_kv_heads * head_dim
    q, k, v = jnp.split(qkv, [nq, nq + nkv], axis=-1)
    q, k, v = (a.reshape(*a.shape[:-1], a.shape[-1] // head_dim, head_dim) for a in (q, k, v))

    def norm_rope(x, w):
        return _rope_reference(x if w is None else rms_norm_reference(x, w, eps), cos, sin)

    q = norm_rope(q, q_norm_w) if num_heads else None
    return (q, norm_rope(k, k_norm_w), v) if num_kv_heads else (q, None, None)


# ----------------------------------------------------------------------------- norm kernels

def _and(*masks):
    """Conjunction of the masks that are needed (None: none is), broadcast by the load/store."""
    masks = [m for m in masks if m is not None]
    out = masks[0] if masks else None
    for m in masks[1:]:
        out = out & m
    return out


def _tail_mask(block: int, n: int, ndim: int):
    """[block, 1, ...] (ndim dims) mask of this program's rows below n; None when n divides
    evenly (unmasked loads leave Triton free to vectorise)."""
    if n % block == 0:
        return None
    ok = pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32) < n
    return ok.reshape(block, *[1] * (ndim - 1))


def _norm_kernel(*refs, n_rows: int, hidden: int, eps: float, residual: bool, unit_offset: bool = False):
    """One block of rows: [s = x + delta;] y = rms_norm(s or x) * w[layer] (unit_offset: * (1 + w)
    in float32, then cast). Refs are [BR, Hp] tiles; w's the whole stack [L, Hp]; layer's a scalar."""
    if residual:
        x_ref, d_ref, w_ref, layer_ref, s_ref, y_ref = refs
    else:
        x_ref, w_ref, layer_ref, y_ref = refs
    br, hp = x_ref.shape
    col_ok = None if hp == hidden else jnp.arange(hp, dtype=jnp.int32) < hidden
    mask = _and(_tail_mask(br, n_rows, 2), None if col_ok is None else col_ok[None, :])
    # Padding lanes and rows past the end load as 0: they add nothing to the sum of squares.
    fill = None if mask is None else 0.0
    # The weight row first: its load waits on the layer's, and neither may move above the store
    # of s below (the compiler does not reorder a load above a store; see _qk_kernel). Untimed.
    w_row = w_ref.at[_layer_rows(layer_ref, w_ref.shape[0])[0]]
    w = pltriton.load(w_row, mask=col_ok, other=None if col_ok is None else 0.0)
    w = 1.0 + w.astype(jnp.float32) if unit_offset else w.astype(y_ref.dtype)
    x = pltriton.load(x_ref, mask=mask, other=fill).astype(y_ref.dtype)
    if residual:  # in the activation dtype, as x + delta
        x = x + pltriton.load(d_ref, mask=mask, other=fill).astype(y_ref.dtype)
        pltriton.store(s_ref, x, mask=mask)
    x32 = x.astype(jnp.float32)
    ms = jnp.sum(x32 * x32, axis=1, keepdims=True) / hidden
    y = x32 * lax.rsqrt(ms + eps)
    y = (y * w[None, :]).astype(x.dtype) if unit_offset else w[None, :] * y.astype(x.dtype)
    pltriton.store(y_ref, y, mask=mask)


def norm_unsupported(x) -> str | None:
    if x.size == 0:
        return "empty input"
    if x.shape[-1] > _MAX_HIDDEN:
        return f"hidden size {x.shape[-1]} > {_MAX_HIDDEN}"
    return None


def _block_rows(per_row: int, n: int, deterministic: bool) -> int:
    """Rows a program holds: a tile of about _TILE elements, fewer where the call has fewer rows;
    deterministic: never fewer (a row's reduction runs over one tile shape, whatever n)."""
    rows = max(1, _TILE // per_row)
    return rows if deterministic else min(rows, _pow2_at_least(n))


def _norm_pallas(x, delta, w, layer, eps, *, interpret: bool, deterministic: bool = False, unit_offset: bool = False):
    """Rows [..., H] -> (s or None, y); one pallas_call. delta: like x; w: the stacked weights
    [L, H], normalising with row layer (read at run time)."""
    h = x.shape[-1]
    dtype = x.dtype if delta is None else jnp.result_type(x, delta)
    x2 = x.reshape(-1, h)
    n = x2.shape[0]
    hp = _pow2_at_least(h)
    br = _block_rows(hp, n, deterministic)
    row = pl.BlockSpec((br, hp), lambda i: (i, 0))    # wider than H: masked in the kernel
    specs = [row]
    ins = [x2]
    if delta is not None:
        ins.append(delta.reshape(-1, h))
        specs.append(row)
    out_shape = jax.ShapeDtypeStruct((n, h), dtype)
    outs = pl.pallas_call(
        lambda *refs: _norm_kernel(*refs, n_rows=n, hidden=h, eps=eps,
                                   residual=delta is not None, unit_offset=unit_offset),
        grid=(pl.cdiv(n, br),),
        # the whole stack (wider than H, masked) and the layer: one kernel for every layer
        in_specs=specs + [pl.BlockSpec((w.shape[0], hp), lambda i: (0, 0)),
                          pl.BlockSpec((None,), lambda i: (0,))],
        out_specs=[row] * (1 if delta is None else 2),
        out_shape=[out_shape] * (1 if delta is None else 2),
        compiler_params=_compiler_params(interpret, br * hp),
        interpret=interpret,
        name="ddtree_rms_norm" if delta is None else "ddtree_add_rms_norm",
    )(*ins, w, layer_index(layer))
    outs = [o.reshape(*x.shape[:-1], h) for o in outs]
    return (None, outs[0]) if delta is None else tuple(outs)


def rms_norm(x: jax.Array, w: jax.Array, eps: float, *, impl: str = "xla", layer=None,
             deterministic: bool = False, unit_offset: bool = False) -> jax.Array:
    """RMSNorm of x [..., H] with weight w [H], as ``layers.rms_norm``; one kernel on Pallas.

    layer (a Python int or an int32 scalar, possibly traced): w is every layer's weight stacked
    [L, H], and row ``layer`` is the weight (see the module doc); or w a StackedRow and no layer.
    deterministic: the kernel's row block does not depend on the number of rows, so a row's
    output is bit for bit the same in a call of any size (a tile's reduction order is its shape's).
    unit_offset: Qwen3.5's RMSNorm, y * (1 + w) in float32 and then cast."""
    w, layer = _weight(w, layer, x.shape[-1], "norm")
    impl = _resolve(impl, norm_unsupported(x))
    if impl == "xla":
        return rms_norm_reference(x, w, eps, layer=layer, unit_offset=unit_offset)
    layer, w = as_stack(layer, w)
    return _norm_pallas(x, None, w, layer, eps, interpret=impl == "pallas_interpret",
                        deterministic=deterministic, unit_offset=unit_offset)[1]


def add_rms_norm(x: jax.Array, delta: jax.Array, w: jax.Array, eps: float, *,
                 impl: str = "xla", layer=None, deterministic: bool = False) -> tuple[jax.Array, jax.Array]:
    """(s, rms_norm(s, w, eps)) with s = x + delta: a residual add and the norm after it.

    s is the new residual stream, added in the activation dtype as ``x + delta`` is; one kernel
    on Pallas. layer: w is the stacked [L, H] and row ``layer`` the weight (or w a StackedRow),
    as in :func:`rms_norm`; deterministic: as there.
    """
    if delta.shape != x.shape:
        raise ValueError(f"x {x.shape} and delta {delta.shape} must have the same shape")
    w, layer = _weight(w, layer, x.shape[-1], "norm")
    impl = _resolve(impl, norm_unsupported(x))
    if impl == "xla":
        return add_rms_norm_reference(x, delta, w, eps, layer=layer)
    layer, w = as_stack(layer, w)
    return _norm_pallas(x, delta, w, layer, eps, interpret=impl == "pallas_interpret", deterministic=deterministic)


# ----------------------------------------------------------------------------- q/k norm + RoPE

def _qk_kernel(x_ref, cos_ref, sin_ref, *refs, n_tok: int, parts, eps: float):
    """One block of tokens. x_ref [BT, Hin, Dh]: the tokens' heads [q | k | v] (Hin >= what is read);
    cos/sin [BT, Dh] float32; then, when a part is normed, the layer (a scalar) and one stacked
    weight ref [L, Dh] per normed part; then one output [BT, Hp, Dh] per part. parts: (first
    head, heads, normed, roped) per output."""
    n_w = sum(normed for _, _, normed, _ in parts)
    layer_ref, refs = (refs[0], refs[1:]) if n_w else (None, refs)
    w_refs, out_refs = refs[:n_w], refs[n_w:]
    rows = _layer_rows(layer_ref, *(w_ref.shape[0] for w_ref in w_refs))
    bt, _, dh = x_ref.shape
    half = dh // 2
    lo, hi = pl.ds(0, half), pl.ds(half, half)

    def table(ref, part):  # [BT, 1, Dh/2]
        mask = _tail_mask(bt, n_tok, 2)
        return pltriton.load(ref.at[:, part], mask=mask,
                             other=None if mask is None else 0.0)[:, None, :]

    cos1, cos2, sin1, sin2 = (table(r, p) for r in (cos_ref, sin_ref) for p in (lo, hi))
    # Every load first, then the math and the stores: the compiler does not move a load above
    # an earlier store (it has no alias information for the buffers), so part by part the three
    # parts' load -> store latencies would add up (3.6 us a call against add_rms_norm's 2.3).
    w_iter = iter(zip(w_refs, rows))
    loaded = []
    for (h0, nh, normed, roped), o_ref in zip(parts, out_refs):
        hp = o_ref.shape[1]
        mask = _and(_tail_mask(bt, n_tok, 3),
                    None if hp == nh else (jnp.arange(hp, dtype=jnp.int32) < nh)[None, :, None])
        fill = None if mask is None else 0.0
        heads = pl.ds(h0, hp)
        if not roped:  # v: a copy out of the fused projection, so that no XLA slice runs
            loaded.append((o_ref, mask, False, None, pltriton.load(x_ref.at[:, heads, :], mask=mask, other=fill)))
            continue
        x1 = pltriton.load(x_ref.at[:, heads, lo], mask=mask, other=fill)
        x2 = pltriton.load(x_ref.at[:, heads, hi], mask=mask, other=fill)
        w = None
        if normed:
            w_ref, row = next(w_iter)
            w = (w_ref[row, lo], w_ref[row, hi])
        loaded.append((o_ref, mask, True, w, (x1, x2)))
    for o_ref, mask, roped, w, x in loaded:
        if not roped:
            pltriton.store(o_ref, x, mask=mask)
            continue
        x1, x2 = x
        dtype = x1.dtype
        if w is not None:
            a1, a2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
            ms = (jnp.sum(a1 * a1, axis=2, keepdims=True)
                  + jnp.sum(a2 * a2, axis=2, keepdims=True)) / dh
            r = lax.rsqrt(ms + eps)
            x1 = w[0].astype(dtype)[None, None, :] * (a1 * r).astype(dtype)
            x2 = w[1].astype(dtype)[None, None, :] * (a2 * r).astype(dtype)
        a1, a2 = x1.astype(jnp.float32), x2.astype(jnp.float32)
        # rotate-half: x * cos + [-x2, x1] * sin, as layers.apply_rope.
        pltriton.store(o_ref.at[:, :, lo], (a1 * cos1 + (-a2) * sin1).astype(dtype), mask=mask)
        pltriton.store(o_ref.at[:, :, hi], (a2 * cos2 + a1 * sin2).astype(dtype), mask=mask)


def qk_unsupported(qkv, head_dim: int) -> str | None:
    if qkv.size == 0:
        return "empty input"
    if head_dim & (head_dim - 1) or head_dim < 4:
        return f"head dim {head_dim} is not a power of two >= 4 (Triton block shapes)"
    return None


def _qk_pallas(qkv, q_norm_w, k_norm_w, cos, sin, layer, *, num_heads, num_kv_heads, head_dim, eps,
               interpret: bool, deterministic: bool = False):
    """q_norm_w / k_norm_w: None or stacked [L, Dh], normalising with row layer (run time)."""
    lead = qkv.shape[:-1]
    n, dh, hq, hkv = math.prod(lead), head_dim, num_heads, num_kv_heads
    x = qkv.reshape(n, hq + 2 * hkv, dh)
    tables = [t.reshape(n, dh).astype(jnp.float32) for t in (cos, sin)]
    parts, weights = [], []          # (first head, heads, normed, roped)
    if hq:
        parts.append((0, hq, q_norm_w is not None, True))
        weights += [] if q_norm_w is None else [q_norm_w]
    if hkv:
        parts.append((hq, hkv, k_norm_w is not None, True))
        parts.append((hq + hkv, hkv, False, False))
        weights += [] if k_norm_w is None else [k_norm_w]
    pads = [_pow2_at_least(nh) for _, nh, _, _ in parts]
    # The input block spans every head slice a part reads; it may run past the array (masked).
    h_in = max(h0 + hp for (h0, _, _, _), hp in zip(parts, pads))
    per_tok = sum(pads) * dh
    bt = _block_rows(per_tok, n, deterministic)
    layer_in = [layer_index(layer)] if weights else []
    outs = pl.pallas_call(
        lambda *refs: _qk_kernel(*refs, n_tok=n, parts=tuple(parts), eps=eps),
        grid=(pl.cdiv(n, bt),),
        in_specs=[pl.BlockSpec((bt, h_in, dh), lambda i: (i, 0, 0))]
        + [pl.BlockSpec((bt, dh), lambda i: (i, 0))] * 2
        + [pl.BlockSpec((None,), lambda i: (0,))] * len(layer_in)
        + [pl.BlockSpec(w.shape, lambda i: (0, 0)) for w in weights],  # whole stacks
        out_specs=[pl.BlockSpec((bt, hp, dh), lambda i: (i, 0, 0)) for hp in pads],
        out_shape=[jax.ShapeDtypeStruct((n, nh, dh), qkv.dtype) for _, nh, _, _ in parts],
        compiler_params=_compiler_params(interpret, bt * per_tok),
        interpret=interpret,
        name="ddtree_qk_norm_rope",
    )(x, *tables, *layer_in, *weights)
    outs = [o.reshape(*lead, o.shape[1], dh) for o in outs]
    if not hq:
        return (None, *outs)
    return (outs[0], *outs[1:]) if hkv else (outs[0], None, None)


def qk_norm_rope(qkv: jax.Array, q_norm_w: jax.Array | None, k_norm_w: jax.Array | None,
                 cos: jax.Array, sin: jax.Array, *, num_heads: int, num_kv_heads: int,
                 head_dim: int, eps: float, impl: str = "xla", layer=None, deterministic: bool = False):
    """Heads of a fused projection, q/k RMS-normed per head and roped: (q, k, v).

    qkv [..., (Hq + 2*Hkv) * Dh] laid out [q | k | v]; cos/sin [..., Dh] float32 (rope_tables).
    Returns q [..., Hq, Dh], k and v [..., Hkv, Dh] in qkv's dtype. A norm weight of None skips
    that norm (Llama, Qwen2). num_heads = 0 means qkv holds only [k | v] (q comes back None);
    num_kv_heads = 0 means only q (k and v come back None). Numerics: the per-head norm in the
    activation dtype (``layers.rms_norm``), then RoPE in float32 (``layers.apply_rope``).
    One kernel on Pallas. layer (a Python int or an int32 scalar, possibly traced): the norm
    weights are every layer's stacked [L, Dh], and row ``layer`` is the weight (module doc); or
    they are StackedRows of the same layer, and no layer is given. deterministic: a token's
    output does not depend on the number of tokens (as in :func:`rms_norm`).
    """
    width = (num_heads + 2 * num_kv_heads) * head_dim
    if qkv.shape[-1] != width or cos.shape != (*qkv.shape[:-1], head_dim) or sin.shape != cos.shape:
        raise ValueError(f"qkv must be [..., (Hq + 2*Hkv) * Dh = {width}] and cos/sin "
                         f"[..., Dh = {head_dim}] over the same leading dims; got qkv "
                         f"{qkv.shape}, cos {cos.shape}, sin {sin.shape}")
    (q_norm_w, q_layer), (k_norm_w, k_layer) = (
        (None, layer) if w is None else _weight(w, layer, head_dim, what)
        for w, what in ((q_norm_w, "q norm"), (k_norm_w, "k norm")))
    static = all(isinstance(i, (int, np.integer)) for i in (q_layer, k_layer))
    if q_norm_w is not None and k_norm_w is not None and q_layer is not k_layer and not (
            static and q_layer == k_layer):
        raise ValueError(f"the q and k norm weights' layers differ ({q_layer} and {k_layer}): one call "
                         "normalises one layer's heads")
    layer = q_layer if q_norm_w is not None else k_layer
    kw = dict(num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, eps=eps)
    impl = _resolve(impl, qk_unsupported(qkv, head_dim))
    if impl == "xla":
        return qk_norm_rope_reference(qkv, q_norm_w, k_norm_w, cos, sin, **kw, layer=layer)
    q_norm_w, k_norm_w = (None if w is None else as_stack(layer, w)[1] for w in (q_norm_w, k_norm_w))
    return _qk_pallas(qkv, q_norm_w, k_norm_w, cos, sin, as_stack(layer)[0], **kw,
                      interpret=impl == "pallas_interpret", deterministic=deterministic)
