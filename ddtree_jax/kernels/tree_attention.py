"""Verify / decode / drafter-block attention: one or two Pallas kernels per call.

Verify attention is memory-bound at small T (few queries, long prefix), and a decode step is
launch-bound: every small kernel around the attention costs ~1.5-3 us on an H200, more than the
whole prefix read at 1k-4k keys. So the call is at most two kernels and no XLA op on layer data:

* ``ddtree_attention`` (grid: row block, part, batch row, kv head). The ``G * T`` query rows that
  share a kv head are folded into the row dimension (row ``r`` = tree token ``r // G``, head
  ``r % G``), so a handful of tree tokens still fills a matrix tile. A program gathers its rows
  of q straight from ``[Bt, T, Hq, Dh]`` and runs one online softmax over its keys: a chunk of
  the committed prefix (``block_k`` keys a step) and/or the T new keys (``block_new`` a step,
  unrolled) under the ancestor mask, read per folded row as one 32-bit word per 32 keys.
* With one part (``num_splits == 1``: short caches, or enough programs from rows and heads)
  that program sees the whole prefix and the new keys and stores the normalised output in
  q.dtype straight into ``[Bt, T, Hq, Dh]``: one kernel per call.
* Otherwise (flash-decoding) the prefix is split into ``n`` chunks and the new keys are one more
  part of their own; each part writes a normalised float32 partial and its log-sum-exp, and
  ``ddtree_attention_merge`` (one program per batch row, kv head and column tile of the
  ``[rows, Dh]`` plane) combines all parts in one shot and stores the output: two kernels.
  (An in-kernel merge by the last program of a row block, through an atomic ticket, measured
  slower than the second kernel.)

Chunks are cut at run time from the traced ``[kv_start, cache_len)``, so a cache much larger than
its prefix still spreads the real keys over all parts; the number of parts is static (from the
cache capacity S and the grid, see :func:`launch_plan`). The only XLA work is packing
``new_mask`` into those words (T > 1): it reads new_mask alone, so the layers of a forward share
one copy (CSE); q and the output only change shape, which is free.

Decode (T = 1) is memory-bound; a tree of B = 64 or more nodes is not: with Hq = 32 heads
and Dh = 128 the prefix attention does 4*Hq*T*Dh FLOP per prefix key against 4*Hkv*Dh bytes,
so at T = 65 the FLOP floor already exceeds the byte floor on an H200.

Which kernel a model's call runs, and with which tiles, is decided in dispatch.py from the
device's KernelTuning and the call's shapes: on Hopper the verify of larger trees, DDTree-64's
72 rows and the drafter's 16 go to the Mosaic GPU kernel (tree_attention_mgpu.py: TMA, wgmma,
warp specialization), and dispatch.verify_rows tells the engine to pad those verifies to a
multiple of 8 rows. This module takes its impl and tiles as arguments.

Backend: Pallas with the Triton lowering, selected explicitly through
``pallas.triton.CompilerParams`` (Mosaic GPU is the default lowering since jax 0.10; the
Triton lowering is deprecated in 0.11 but compiles and runs there). The same ``pallas_call``s
run with ``interpret=True`` on CPU, which is how the tests run them; the tests also lower the
GPU path for CUDA and verify its Triton modules, which needs no GPU (a ``jnp.where`` between two
Python scalars, for one, lowers to constants of the predicate's type i1 and fails there).
Measured by bench/bench_kernels.py.

Products: bf16 / f16 inputs on the tensor cores with float32 accumulation; float32 inputs
(the engine's --dtype float32, for exact comparisons) as three TF32 tensor-core products a dot
(TF32x3, near float32's accuracy), not one IEEE product on the FMA units, which made a float32
DDTree-64 round 4.5x slower. Interpret mode computes at HIGHEST.

Row tiles: the G*T folded rows are rounded up to a multiple of ``block_m`` (16..128). Padded
rows repeat the last tree token (finite, never stored). T a multiple of 16 (B = 63, 255) wastes
nothing; T = 65 pads 260 rows to 320. Row and key indices are gathered with index arrays and
clamped into range, so no load leaves its array; the stores that could are masked.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .attention_reference import _precision, attention_reference, check_attention_shapes
from .stacking import as_stack, clamp_layer, layer_index
from . import tree_attention_mgpu as mgpu
from .tables import read_device_table, table_file

try:  # The Triton lowering is deprecated in jax 0.11 and may disappear later.
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover - depends on the installed jax
    pltriton = None

__all__ = [
    "attention", "attention_pallas", "unsupported", "KernelConfig", "default_config", "tuned_attention_config",
    "attention_table", "launch_plan", "LaunchPlan", "IMPLS",
]

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
# Finite "minus infinity" for masked scores: keeps max/exp free of inf - inf.
_NEG = -1e30
# Most prefix chunks: bounds the merge kernel's tile (parts x columns).
_MAX_SPLITS = 255
# Measured per-device tiles that beat default_config end to end (see tuned_attention_config).
TABLE_PATH = Path(__file__).with_name("attention_configs.json")
# skip_empty=None skips empty new-key steps from this many steps a call: at 9 steps of 128 keys
# (DDTree-1024) the skip saves 6 % of a round; at 3 it costs, since a branch per step keeps the
# compiler from issuing the step's gathers early.
SKIP_MIN_STEPS = 8


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch knobs of the attention kernels (all static)."""
    block_m: int = 64        # folded query rows (G*T padded) per program
    block_k: int = 64        # prefix keys per inner step
    num_warps: int = 4
    num_stages: int = 3
    # Prefix chunks. 1: one kernel writes the output (no merge kernel); None: from the shapes,
    # see _num_splits (target_programs, min_chunk).
    num_splits: int | None = None
    target_programs: int = 528      # ~4 programs per H100/H200 SM
    min_chunk: int = 256            # keys; a cache shorter than 2 chunks is not split
    max_chunk: int | None = None    # keys; a long cache gets more chunks than target_programs asks
    split_edges: bool = True        # unmasked loop over interior key blocks
    merge_tile: int = 4096          # elements (parts x columns) per merge program
    block_new: int | None = None    # new keys per step; None: T rounded up to 16..128
    # Skip a new-key step that no row of the program's block may see (tree mask): exact, since
    # such a step leaves (acc, max, sum) as they are. None: where a call has at least
    # SKIP_MIN_STEPS new-key steps (see there).
    skip_empty: bool | None = None


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """What one call launches (all static): see :func:`launch_plan`."""
    rows: int            # folded query rows per (batch row, kv head): G*T
    row_blocks: int      # ceil(rows / block_m)
    num_splits: int      # prefix chunks (1: single-kernel path)
    parts: int           # partials per row (num_splits + 1 when merged, else 1)
    block_new: int       # new keys per step
    merge_width: int     # merge kernel: columns of the [rows, Dh] plane per program (0: none)

    @property
    def merged(self) -> bool:
        """Parts write float32 partials that the merge kernel combines."""
        return self.parts > 1

    @property
    def kernels(self) -> int:
        """pallas_calls per attention call: the main kernel, and the merge when merged."""
        return 2 if self.merged else 1


def _pow2_at_least(n: int, lo: int) -> int:
    return max(lo, 1 << max(0, (n - 1).bit_length()))


def default_config(t: int, g: int, dh: int, itemsize: int = 2) -> KernelConfig:
    """Static tile choice from the folded row count M = G*T (tile sweeps of bench/bench_kernels.py,
    Hq=32, Hkv=8, Dh=128, on H100 / H200).

    * Decode (M <= 16) is memory-bound: 64-key blocks on 2 warps and 3 stages (4 warps and a
      4-deep ring, 128 KB of shared memory and so one program an SM, were 1-4 % slower), prefix
      chunks of 64 to 512 keys aiming at 32 chunks for 8 kv heads (at or near the fastest in
      device time from 1k to 32k keys), and 2048 merge elements a program (a short cache has few
      parts: 4096 gave the merge too few programs, 2.4 against 1.5 us at 512 keys).
    * Verify of a small tree (M < 512, T = 65: 260 rows) liked 64x64 tiles on one warpgroup; of a
      large one (T = 257: 1028 rows) 128x128 tiles on two warpgroups. A tree verify prefers few
      prefix chunks (every chunk adds a [rows, Dh] float32 partial to write and merge): chunks of
      at least 1024 keys.
    * float32 inputs (TF32x3 products, twice the bytes a tile) keep the 64x64 tiles for every
      M > 16 (128x128 would hold a [128, 128] float32 score block plus twice-as-large operand
      tiles a thread), on 2 stages at Dh = 128, where 3 need more shared memory than an H100 /
      H200 SM has (262144 bytes against 232448). float32 decode takes 32-key blocks on 2 stages
      (53 against 447 us on the bf16 decode tiles, whose 192 KB float32 ring allows one program
      an SM).
    * Rows of 512 bytes or more (Qwen3.5's Dh = 256 in bf16: a 64-key K or V tile is the 32 KiB
      of float32's at Dh = 128) take float32's tiles: the bf16 tiles asked 262144 bytes there too.
    """
    m = t * g
    f32 = itemsize >= 4
    wide = dh * itemsize >= 512
    if m <= 16:
        small = f32 or wide
        return KernelConfig(block_m=16, block_k=32 if small else 64, num_warps=2, num_stages=2 if small else 3,
                            target_programs=256, min_chunk=64, max_chunk=512, merge_tile=2048)
    if m < 512 or f32 or wide:
        return KernelConfig(block_m=min(_pow2_at_least(m, 16), 64), block_k=64, num_warps=4,
                            num_stages=2 if wide else 3, min_chunk=1024)
    return KernelConfig(block_m=128, block_k=128 if dh <= 128 else 64, num_warps=8,
                        num_stages=3, min_chunk=1024)


def _check_attention_entry(path: str, kind: str, e) -> None:
    fields = {f.name for f in dataclasses.fields(KernelConfig)}
    if not isinstance(e, dict) or not {"t", "g", "dh", "config"} <= set(e) or set(e["config"]) - fields:
        raise ValueError(f"attention table {path}, {kind}: entry {e} needs t [lo, hi], g, dh and a "
                         f"config of KernelConfig fields ({sorted(fields)}); fix the entry")
    for key in ("t", "s"):
        r = e.get(key, [0, 0])
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and r[0] <= r[1]):
            raise ValueError(f"attention table {path}, {kind}: entry {e} has {key} = {r!r}; "
                             f"it must be [lo, hi] with integers lo <= hi; fix the entry")


def attention_table(path: str | Path | None = None) -> dict:
    """The attention tile table at `path` (None: the shipped one, beside this file), every entry
    checked; ValueError names the file and what is wrong."""
    path, shipped = table_file(path, TABLE_PATH)
    return read_device_table(path, "attention", _check_attention_entry, shipped)


def tuned_attention_config(t: int, g: int, dh: int, itemsize: int = 2, device_kind: str | None = None,
                           s: int | None = None, table: dict | None = None) -> KernelConfig | None:
    """The tiles measured faster than :func:`default_config` for T new tokens, G query heads per
    kv head, head dim dh and a cache of capacity s (None: any) on this device kind (None: none,
    so no entry), or None.

    The table (default: the shipped ``attention_configs.json`` beside this file; a tool passes
    another as `table`, e.g. ``attention_table(path)``) maps a device kind to entries ``{t: [lo,
    hi], g, dh, itemsize (default 2), s: [lo, hi] (optional: the cache capacities it was measured
    for), config: {KernelConfig fields}}``; fields an entry leaves out come from default_config;
    the first matching entry wins. The capacity bound exists because a tile's prefix-part count (a
    `num_splits` of 1, say) that wins at a short cache serialises a long one. An entry goes in
    only when a round run with it beat the default end to end: a kernel sweep alone, with its
    caches cold and nothing around it, has ranked tiles differently from the round.
    """
    if device_kind is None:
        return None
    for e in (attention_table() if table is None else table).get(device_kind, ()):
        lo, hi = e["t"]
        s_lo, s_hi = e.get("s", (0, 2**62))
        if s is not None and not s_lo <= s <= s_hi:
            continue
        if lo <= t <= hi and (e["g"], e["dh"], e.get("itemsize", 2)) == (g, dh, itemsize):
            return dataclasses.replace(default_config(t, g, dh, itemsize), **e["config"])
    return None


def _num_splits(cfg: KernelConfig, s: int, programs_per_split: int) -> int:
    """Prefix chunks for a cache of capacity s (static).

    Enough programs to fill the GPU (target_programs), but every chunk of a full cache keeps at
    least min_chunk keys: below two chunks' worth there is one part and no merge kernel, whose
    launch costs more than the few keys a split would save. max_chunk (if set) bounds a chunk
    from above: a long cache gets more chunks than target_programs asks for, up to twice its
    programs (so a batch that fills the GPU with its rows is not cut further). Decode's rule
    was swept at batch 1 only.
    """
    if s == 0:
        return 1
    if cfg.num_splits is not None:
        return max(1, min(cfg.num_splits, pl.cdiv(s, cfg.block_k), _MAX_SPLITS))
    want = pl.cdiv(cfg.target_programs, programs_per_split)
    if cfg.max_chunk and programs_per_split * pl.cdiv(s, cfg.max_chunk) <= 2 * cfg.target_programs:
        want = max(want, pl.cdiv(s, cfg.max_chunk))
    most = s // max(cfg.min_chunk, cfg.block_k)
    return max(1, min(want, most, _MAX_SPLITS))


def launch_plan(bt: int, t: int, hkv: int, g: int, dh: int, s: int,
                cfg: KernelConfig) -> LaunchPlan:
    """The static launch shape of :func:`attention_pallas` for these sizes and tiles."""
    rows = t * g
    n_m = pl.cdiv(rows, cfg.block_m)
    n_split = _num_splits(cfg, s, n_m * bt * hkv)
    # One step for T <= 128: fewer unrolled steps kept registers lower (Triton 3.9, sm_90).
    block_new = cfg.block_new or min(128, _pow2_at_least(t, 16))
    if n_split == 1:
        return LaunchPlan(rows, n_m, 1, 1, block_new, 0)
    parts = n_split + 1
    width = max(16, min(cfg.merge_tile // _pow2_at_least(parts, 1),
                        _pow2_at_least(rows * dh, 16)))
    return LaunchPlan(rows, n_m, n_split, parts, block_new, width)


def _skips(cfg: KernelConfig, t: int, block_new: int) -> bool:
    """Whether the main kernel skips empty new-key steps (cfg.skip_empty; None: by the step
    count). One step never skips: every row sees itself (and T = 1 has no mask bits)."""
    steps = pl.cdiv(t, block_new)
    want = steps >= SKIP_MIN_STEPS if cfg.skip_empty is None else cfg.skip_empty
    return want and steps > 1


def _compiler_params(num_warps: int, num_stages: int, interpret: bool):
    if pltriton is None or interpret:
        return None
    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


# ----------------------------------------------------------------------------- main kernel

def _attention_kernel(*refs, scale: float, t: int, g: int, block_m: int, block_k: int,
                      block_new: int, n_split: int, seq: int, precision, split_edges: bool,
                      has_prefix: bool, has_window: bool, has_mask: bool, merged: bool,
                      skip_empty: bool = False, n_layers: int = 1):
    """One (row block, part, batch row, kv head).

    Refs, in order (some only when their flag is set): kv_start [] (has_window), cache_len []
    and layer [] (has_prefix), q [T, G, Dh], k_cache and v_cache [L * Bt, S, Dh] (has_prefix;
    this kv head of every layer's every batch row, never copied: the program reads row
    layer * Bt + b), k_new and v_new [T, Dh], mask bits int32 [T, W]
    (has_mask; bit j % 32 of word j // 32 of row i: token i sees new key j);
    outputs: o [T, G, Dh] in q.dtype, or (merged) o [BM, Dh] float32 normalised and lse [BM]
    float32 (natural log, -inf for a part without keys).
    skip_empty: a new-key step whose keys no row of this block may see is skipped (a branch
    on the OR of its mask bits); a tree row sees only its ancestors, so most row blocks of a
    large tree skip most steps.
    """
    refs = list(refs)
    lo_ref = refs.pop(0) if has_window else None
    hi_ref = refs.pop(0) if has_prefix else None
    layer_ref = refs.pop(0) if has_prefix else None
    q_ref = refs.pop(0)
    k_ref, v_ref = (refs.pop(0), refs.pop(0)) if has_prefix else (None, None)
    kn_ref, vn_ref = refs.pop(0), refs.pop(0)
    bits_ref = refs.pop(0) if has_mask else None
    o_ref, lse_ref = (refs[0], refs[1]) if merged else (refs[0], None)

    dh = q_ref.shape[-1]
    part = pl.program_id(1)
    rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)
    if g == 1:
        tq, gq = rows, jnp.zeros_like(rows)
    else:
        tq, gq = lax.div(rows, g), lax.rem(rows, g)
    tc = jnp.minimum(tq, t - 1)         # padded rows repeat the last token: finite, not stored
    cols = jnp.arange(dh, dtype=jnp.int32)[None, :]
    q = q_ref[tc[:, None], gq[:, None], cols]                               # [BM, Dh]
    # exp2 domain: the carry's max is in scaled units and the scale is folded into exp2's argument
    # (s * qk_scale - max: one multiply-add a score, fused where the compiler contracts it, where a
    # scaling pass and a subtraction were two); qk_scale > 0, so max(s) * qk_scale = max(s *
    # qk_scale). A masked score is _NEG unscaled (finite after scaling too).
    qk_scale = scale * _LOG2E

    def online(carry, s, v, allowed):
        """Fold unscaled scores s [BM, K] and values v [K, Dh] into (acc, max, sum)."""
        acc, m_i, l_i = carry
        m_new = jnp.maximum(m_i, s.max(axis=1) * qk_scale)
        alpha = jnp.exp2(m_i - m_new)
        p = jnp.exp2(s * qk_scale - m_new[:, None])
        if allowed is not None:
            # A block may hold no key a row can see (tree mask): then m_new can be _NEG * qk_scale.
            p = jnp.where(allowed, p, 0.0)
        l_new = alpha * l_i + p.sum(axis=1)
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())),
                             precision=precision, preferred_element_type=jnp.float32)
        return alpha[:, None] * acc + pv, m_new, l_new

    def scores(k):
        return lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=precision,
                               preferred_element_type=jnp.float32)

    carry = (jnp.zeros((block_m, dh), jnp.float32), jnp.full((block_m,), _NEG, jnp.float32),
             jnp.zeros((block_m,), jnp.float32))

    if has_prefix:
        # This part's keys [lo, hi): the visible prefix [lo0, hi0), cut into n_split chunks of
        # whole key blocks at run time. The new-key part (index n_split) gets none.
        lo0 = jnp.maximum(lo_ref[()], 0) if has_window else jnp.int32(0)
        hi0 = jnp.minimum(hi_ref[()], seq)
        if n_split == 1:
            lo, hi = lo0, hi0
        else:
            base = lax.div(lo0, block_k) * block_k
            span = jnp.maximum(hi0 - base, 0)
            chunk = lax.div(lax.div(span + (n_split - 1), n_split) + (block_k - 1),
                            block_k) * block_k
            start = base + part * chunk
            lo = jnp.maximum(start, lo0)
            hi = jnp.minimum(start + chunk, hi0)
        # Key blocks touching [lo, hi): j_lo..j_hi. Blocks entirely inside: f_lo..f_hi; only
        # the (at most two) ragged edge blocks pay for masked loads and score masking. lo,
        # hi >= 0, so truncating division is floor division (and lowers to one Triton op).
        nonempty = hi > lo
        j_lo = lax.div(lo, block_k)
        j_hi = jnp.where(nonempty, lax.div(hi + (block_k - 1), block_k), j_lo)
        f_lo = jnp.where(nonempty, lax.div(lo + (block_k - 1), block_k), j_lo)
        f_hi = jnp.maximum(jnp.where(nonempty, lax.div(hi, block_k), j_lo), f_lo)
        offs = jnp.arange(block_k, dtype=jnp.int32)
        # This program's cache row: batch row b of the layer read at run time (one compiled
        # kernel serves every layer of a forward), clamped into the stack as XLA's dynamic
        # index is, so that no load leaves the array.
        crow = clamp_layer(layer_ref[()], n_layers) * pl.num_programs(2) + pl.program_id(2)

        def prefix_step(j, carry, masked: bool):
            start = pl.multiple_of(j * block_k, block_k)
            krows = pl.ds(start, block_k)
            if masked:
                idx = start + offs
                valid = (idx >= lo) & (idx < hi)
                # Rows past S are never touched; stale/NaN rows come in as zeros.
                k = pltriton.load(k_ref.at[crow, krows, :], mask=valid[:, None], other=0.0)
                v = pltriton.load(v_ref.at[crow, krows, :], mask=valid[:, None], other=0.0)
                s = jnp.where(valid[None, :], scores(k), _NEG)
            else:
                k, v = k_ref[crow, krows, :], v_ref[crow, krows, :]
                s = scores(k)
            # Each visited block holds >= 1 valid key, so exp2(_NEG * qk_scale - m_new) underflows to 0.
            return online(carry, s, v, None)

        masked_step = functools.partial(prefix_step, masked=True)
        if split_edges:
            # The edge blocks (0 or 1 each) go through lax.cond, not loops: Triton software-
            # pipelines every loop, and a 0-or-1-trip loop would only add prologue code.
            carry = lax.cond(j_lo < jnp.minimum(f_lo, j_hi), lambda c: masked_step(j_lo, c),
                             lambda c: c, carry)
            carry = lax.fori_loop(f_lo, f_hi, functools.partial(prefix_step, masked=False),
                                  carry)
            carry = lax.cond(f_hi < j_hi, lambda c: masked_step(f_hi, c), lambda c: c, carry)
        else:
            carry = lax.fori_loop(j_lo, j_hi, masked_step, carry)

    # The T new keys, block_new at a time: row r sees new key j iff new_mask[r // G, j].
    koffs = jnp.arange(block_new, dtype=jnp.int32)

    def new_step(jb: int, carry):
        j = jb * block_new + koffs
        jc = jnp.minimum(j, t - 1)
        allowed = (j < t)[None, :]
        if has_mask:
            # One 32-bit word per row and 32 keys: a [BM] gather instead of a [BM, K] one,
            # whose pointer tensor alone would cost 64 registers a thread at 128 x 64.
            words = None
            for w in range(jb * block_new // 32, (jb * block_new + block_new - 1) // 32 + 1):
                word = bits_ref[tc, min(w, bits_ref.shape[-1] - 1)][:, None]       # [BM, 1]
                words = word if words is None else jnp.where(
                    lax.div(j, 32)[None, :] == w, word, words)
            bit = lax.shift_right_logical(words, lax.rem(j, 32)[None, :]) & 1
            allowed = allowed & (bit != 0)

        def step(carry):
            kn = kn_ref[jc[:, None], cols]
            vn = vn_ref[jc[:, None], cols]
            s = jnp.where(allowed, scores(kn), _NEG)
            return online(carry, s, vn, allowed)

        if not skip_empty:
            return step(carry)
        # No row sees any of these keys: online() would keep (acc, max, sum) bit for bit, so
        # skip the loads and both products.
        seen = allowed.astype(jnp.int32).max(axis=1).max(axis=0)
        return lax.cond(seen > 0, step, lambda c: c, carry)

    def new_keys(carry):
        # Unrolled, not a loop: Triton would software-pipeline a loop and stage its gathered
        # loads in shared memory on top of the prefix loop's buffers (T = 257 on 128x128 tiles
        # then needs more than an H200 SM has).
        for jb in range(pl.cdiv(t, block_new)):
            carry = new_step(jb, carry)
        return carry

    if merged:
        carry = lax.cond(part == n_split, new_keys, lambda c: c, carry)
    else:
        carry = new_keys(carry)

    acc, m_i, l_i = carry
    has = l_i > 0.0
    l_safe = jnp.where(has, l_i, 1.0)
    o = acc / l_safe[:, None]
    if merged:
        pltriton.store(o_ref, o, mask=(rows < t * g)[:, None])  # padded rows: not read
        lse_ref[...] = jnp.where(has, m_i * _LN2 + jnp.log(l_safe), -jnp.inf)
    else:
        pltriton.store(o_ref.at[tq[:, None], gq[:, None], cols], o.astype(o_ref.dtype),
                       mask=(tq < t)[:, None])


def _kernel_precision(dtype, interpret: bool):
    """The products' precision in the Triton kernel: _precision's, except for float32 inputs on
    the compiled path: three TF32 tensor-core products a dot (each operand split into a high and
    a low TF32 part, the low x low product dropped), near float32's accuracy, where one IEEE
    product (Precision.HIGHEST) runs on the FMA units and made a float32 round 4.5x slower.
    Interpret mode runs HIGHEST."""
    if interpret or jnp.dtype(dtype) != jnp.float32:
        return _precision(dtype)
    return lax.DotAlgorithmPreset.TF32_TF32_F32_X3


def _attention_call(q5, k_new, v_new, k_cache, v_cache, kv_start, cache_len, layer, mask_bits, *,
                    scale: float, cfg: KernelConfig, plan: LaunchPlan, interpret: bool):
    """The main kernel over layer `layer` (int32[1]) of caches [L, Bt, Hkv, S, Dh]. Returns
    o [Bt, T, Hkv, G, Dh] (one part) or the partials (o [Bt, Hkv, parts, Mp, Dh],
    lse [Bt, Hkv, parts, Mp], float32)."""
    bt, t, hkv, g, dh = q5.shape
    n_layers, s = k_cache.shape[0], k_cache.shape[3]
    # Layers and batch rows in one dimension (free): a program's row is layer * Bt + b, read
    # at run time, since a block index can only come from the grid.
    k_cache = k_cache.reshape(n_layers * bt, hkv, s, dh)
    v_cache = v_cache.reshape(n_layers * bt, hkv, s, dh)
    bm = cfg.block_m
    n_m, parts, merged = plan.row_blocks, plan.parts, plan.merged
    mp = n_m * bm
    has_prefix, has_window, has_mask = s > 0, kv_start is not None, mask_bits is not None

    kernel = functools.partial(
        _attention_kernel, scale=scale, t=t, g=g, block_m=bm, block_k=cfg.block_k,
        block_new=plan.block_new, n_split=plan.num_splits, seq=s,
        precision=_kernel_precision(q5.dtype, interpret),
        # An unmasked block must fit in the cache row.
        split_edges=cfg.split_edges and cfg.block_k <= s, has_prefix=has_prefix,
        has_window=has_window, has_mask=has_mask, merged=merged,
        skip_empty=_skips(cfg, t, plan.block_new), n_layers=n_layers)
    # Grid order (row block, part, b, h): the row blocks of one chunk are launched next to
    # each other, so the chunk's K/V is read from HBM once and then hits L2.
    grid = (n_m, parts, bt, hkv)
    scalar = pl.BlockSpec((None,), lambda m, c, b, h: (b,))
    per_head = pl.BlockSpec((None, t, None, g, dh), lambda m, c, b, h: (b, 0, h, 0, 0))
    cache_rows = pl.BlockSpec((n_layers * bt, None, s, dh), lambda m, c, b, h: (0, h, 0, 0))
    new_kv = pl.BlockSpec((None, t, None, dh), lambda m, c, b, h: (b, 0, h, 0))
    args, specs = [], []
    if has_window:
        args.append(kv_start)
        specs.append(scalar)
    if has_prefix:
        args += [cache_len, layer]
        specs += [scalar, pl.BlockSpec((None,), lambda m, c, b, h: (0,))]
    args.append(q5)
    specs.append(per_head)
    if has_prefix:
        args += [k_cache, v_cache]
        specs += [cache_rows, cache_rows]
    args += [k_new, v_new]
    specs += [new_kv, new_kv]
    if has_mask:
        args.append(mask_bits)
        specs.append(pl.BlockSpec((None, t, mask_bits.shape[-1]), lambda m, c, b, h: (b, 0, 0)))
    if merged:
        out_specs = [
            pl.BlockSpec((None, None, None, bm, dh), lambda m, c, b, h: (b, h, c, m, 0)),
            pl.BlockSpec((None, None, None, bm), lambda m, c, b, h: (b, h, c, m)),
        ]
        out_shape = [jax.ShapeDtypeStruct((bt, hkv, parts, mp, dh), jnp.float32),
                     jax.ShapeDtypeStruct((bt, hkv, parts, mp), jnp.float32)]
    else:
        out_specs = per_head
        out_shape = jax.ShapeDtypeStruct(q5.shape, q5.dtype)
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=_compiler_params(cfg.num_warps, cfg.num_stages, interpret),
        interpret=interpret,
        name="ddtree_attention",
    )(*args)


# ----------------------------------------------------------------------------- merge kernel

def _merge_kernel(lse_ref, o_ref, out_ref, *, parts: int, t: int, g: int, width: int):
    """One (column tile, batch row, kv head): combine all parts of `width` columns of the
    folded [rows, Dh] plane. lse_ref [parts, Mp]; o_ref [parts, Mp*Dh] (normalised partials,
    rows < G*T written); out_ref [T, G, Dh] in the output dtype."""
    dh = out_ref.shape[-1]
    n_cols = t * g * dh
    p_idx = jnp.arange(_pow2_at_least(parts, 1), dtype=jnp.int32)
    p_valid = (p_idx < parts)[:, None]
    pc = jnp.minimum(p_idx, parts - 1)[:, None]
    col = pl.program_id(0) * width + jnp.arange(width, dtype=jnp.int32)
    colc = jnp.minimum(col, n_cols - 1)[None, :]     # every read was written by a part
    # Indices clamped into range, and the padding parts (p >= parts) not loaded at all.
    lse = pltriton.load(lse_ref.at[pc, lax.div(colc, dh)], mask=p_valid, other=-jnp.inf)
    o = pltriton.load(o_ref.at[pc, colc], mask=p_valid, other=0.0)          # [P, W]
    # The new-key part is finite for every row, so the max is finite and parts without keys
    # (lse = -inf) and the padding parts weigh exactly 0.
    w = jnp.exp(lse - lse.max(axis=0)[None, :])
    out = (w * o).sum(axis=0) / w.sum(axis=0)                                # [W]
    row, d = lax.div(col, dh), lax.rem(col, dh)
    pltriton.store(out_ref.at[lax.div(row, g), lax.rem(row, g), d], out.astype(out_ref.dtype),
                   mask=col < n_cols)


def _merge_call(o_part, lse, *, t: int, g: int, dtype, plan: LaunchPlan, interpret: bool):
    bt, hkv, parts, mp, dh = o_part.shape
    width = plan.merge_width
    grid = (pl.cdiv(t * g * dh, width), bt, hkv)
    return pl.pallas_call(
        functools.partial(_merge_kernel, parts=parts, t=t, g=g, width=width),
        grid=grid,
        in_specs=[pl.BlockSpec((None, None, parts, mp), lambda k, b, h: (b, h, 0, 0)),
                  pl.BlockSpec((None, None, parts, mp * dh), lambda k, b, h: (b, h, 0, 0))],
        out_specs=pl.BlockSpec((None, t, None, g, dh), lambda k, b, h: (b, 0, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((bt, t, hkv, g, dh), dtype),
        compiler_params=_compiler_params(4, 2, interpret),
        interpret=interpret,
        name="ddtree_attention_merge",
    )(lse, o_part.reshape(bt, hkv, parts, mp * dh))


def _pack_mask(new_mask):
    """bool [Bt, T, T] -> int32 [Bt, T, ceil(T/32)]: bit j % 32 of word j // 32 = new_mask[..., j].

    One small XLA fusion that depends on new_mask alone, so a forward's layers share it (CSE).
    """
    bt, t, _ = new_mask.shape
    w = pl.cdiv(t, 32)
    m = jnp.pad(new_mask, ((0, 0), (0, 0), (0, 32 * w - t))).reshape(bt, t, w, 32)
    words = (m.astype(jnp.uint32) << jnp.arange(32, dtype=jnp.uint32)).sum(-1, dtype=jnp.uint32)
    return lax.bitcast_convert_type(words, jnp.int32)


def unsupported(q, k_cache) -> str | None:
    """Why the kernel cannot run these shapes (None if it can); k_cache as passed (one layer's
    or all layers' stacked)."""
    dh = q.shape[-1]
    if dh & (dh - 1) or dh < 16:
        return f"head dim {dh} is not a power of two >= 16 (Triton block shapes)"
    # Pallas's Triton lowering indexes an array of over 2**32 bytes with 64-bit offsets (jax
    # 0.10 and 0.11), so only a 1-byte cache of 2**31 or more elements could overflow int32.
    n = math.prod(k_cache.shape)
    if n >= 2**31 and n * jnp.dtype(k_cache.dtype).itemsize <= 2**32:
        return f"cache of {n} elements overflows the kernel's int32 offsets"
    return None


def attention_pallas(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
                     kv_start=None, interpret: bool = False, config: KernelConfig | None = None,
                     layer=None):
    """Pallas path (one kernel, or two with the merge); same contract as :func:`attention`.
    config: the tiles (None: :func:`default_config`; dispatch passes the tuned table's)."""
    bt, t, hq, hkv, dh, s, g = check_attention_shapes(
        q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer)
    why = unsupported(q, k_cache)
    if why:
        raise ValueError(f"the Pallas attention kernel cannot take these shapes: {why}; "
                         "use impl='xla'")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton);"
                           " use impl='xla'")
    itemsize = jnp.dtype(q.dtype).itemsize
    cfg = config or default_config(t, g, dh, itemsize)
    plan = launch_plan(bt, t, hkv, g, dh, s, cfg)
    cache_len = cache_len.astype(jnp.int32)
    if kv_start is not None:
        kv_start = kv_start.astype(jnp.int32)
    # T = 1: the only new key is the token itself, which the contract says it sees.
    mask_bits = _pack_mask(new_mask) if t > 1 else None
    q5 = q.reshape(bt, t, hkv, g, dh)                     # free: head h*G + j -> (h, j)
    layer, k_cache, v_cache = as_stack(layer, k_cache, v_cache)
    out = _attention_call(q5, k_new, v_new, k_cache, v_cache, kv_start, cache_len, layer_index(layer),
                          mask_bits, scale=scale, cfg=cfg, plan=plan, interpret=interpret)
    if plan.merged:
        out = _merge_call(*out, t=t, g=g, dtype=q.dtype, plan=plan, interpret=interpret)
    return out.reshape(bt, t, hq, dh)


# ----------------------------------------------------------------------------- entry

IMPLS = ("xla", "pallas", "triton", "pallas_interpret", "mosaic", "mosaic_interpret")


def attention(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
              kv_start=None, impl: str = "xla", config=None, layer=None):
    """Attention of T new tokens over a committed prefix plus themselves.

    q [Bt, T, Hq, Dh]; k_new, v_new [Bt, T, Hkv, Dh]; k_cache, v_cache [Bt, Hkv, S, Dh], or every
    layer's stacked [L, Bt, Hkv, S, Dh] with `layer` (an int or an int32 scalar, read at run
    time by the kernels: one compiled kernel serves every layer) picking the one attended to;
    cache_len int32[Bt] (traced; positions >= cache_len are ignored, whatever they hold);
    new_mask bool[Bt, T, T] (row i may see new key j; each row must allow itself);
    kv_start int32[Bt] or None (first visible prefix position, for sliding windows).
    Query head h uses kv head h // (Hq // Hkv). Softmax in float32. Returns [Bt, T, Hq, Dh]
    in q.dtype. impl: "xla" | "pallas" (= "triton") | "pallas_interpret" | "mosaic" (the Mosaic
    GPU kernel, Hopper only; tree_attention_mgpu.py) | "mosaic_interpret". config: the Triton
    kernel's KernelConfig or the Mosaic GPU kernel's MgpuConfig (None: its default for these
    shapes). The models go through dispatch.attention, which picks impl and config per device.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {IMPLS} "
                         "(\"auto\" is chosen per device by ddtree_jax.kernels.dispatch)")
    check_attention_shapes(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer)
    if impl == "xla":
        return attention_reference(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask,
                                   scale=scale, kv_start=kv_start, layer=layer)
    if impl in ("mosaic", "mosaic_interpret"):
        return mgpu.attention_mgpu(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                                   kv_start=kv_start, config=config or mgpu.config_for(q.shape[1]),
                                   interpret=impl == "mosaic_interpret", layer=layer)
    return attention_pallas(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, scale=scale,
                            kv_start=kv_start, interpret=(impl == "pallas_interpret"),
                            config=config, layer=layer)
