"""Skinny matrix products ``x [..., K] @ w [K, N]`` for few rows (verify, drafter, decode).

Why: a verify pass multiplies 17-257 token rows by every weight matrix of the target, so each
product is a read of the weight (memory-bound: 2 x rows FLOP per 2 weight bytes is far below an
H200's ~200 FLOP/byte ridge). The libraries' kernels are built for large M: on the H200 cuBLAS
read the 8B shape's q/k/v and o weights at 2.4-2.6 TB/s for 65 rows, against ~4.0 TB/s for one
row. Here every program owns a column slab of ``w`` and all the rows of ``x`` (a power-of-two
row tile, plus a 16-row tail tile for rows just above it; rows past M are masked, so padding
moves no bytes), streams its slab through shared memory ``block_k`` rows at a time (Triton's
software pipeline, ``num_stages`` deep) and stores its output tile once: each weight byte is
read exactly once. With ``split_k > 1`` the K range is cut into parts whose float32 partials
one XLA fusion adds in a fixed order (for narrow N, where column slabs alone give too few
programs to keep HBM busy). ``swap_ab`` accumulates w_tile^T @ x_tile^T instead,
so the weight tile fills the MMA's 64-row side and the few rows of x its narrow side (a tile
option for the tuned table; bench/bench_gemm.py sweeps it).

What can ride along, so that a decoder layer needs fewer kernels: a prologue on x (``swiglu``:
silu(gate) * up of a gate_up output; ``rmsnorm``: the RMSNorm of x, its per-row scale applied
to the accumulated product), a residual add on the output, and int8 weights with per-column
scales (``Int8Weight``, a quantized drafter's).

Numerics: float32 accumulation, one rounding to the output dtype (as XLA's bf16 dot with
float32 accumulation); the summation order differs from cuBLAS', so bf16 results can differ in
the last bit. float32 inputs use IEEE-exact dots (``Precision.HIGHEST``), never TF32.

Deterministic mode (ddtree_jax.tuning.KernelTuning.deterministic): `deterministic_config` fixes
the row tile (16 rows, each tile its own MMA of one shape), the K step, the column slab and the
split count by the weight's shape alone, and the parts are summed in one order, so a row's
output is the same bits in a product of any number of rows; `grouped_matmul` runs an MoE's
experts the same way (`group_rows` lays out their rows).

Backend: Pallas with the Triton lowering (as tree_attention.py); ``interpret=True`` on CPU for
the tests. The models' "auto" (ddtree_jax.kernels.dispatch) takes the kernel only where it was
measured faster than XLA's dot on this kind of GPU: the tuned table ``matmul_configs.json``
beside this file (per device kind, entries ``{k, n, prologue ("swiglu", "rmsnorm") and weight
("int8"), both absent for none, rows: [lo, hi], config: [MatmulConfig's fields in order], us,
xla_us}``, written by ``python -m bench.bench_gemm --write-table``; a tool passes another as
``table=``). An entry may also name ``xla_options`` ({option: value}): it then applies only in
an executable compiled with those options (whose XLA dots they slow down: the split-K-1 round
executables of ``ddtree_jax.engine.round_xla_options``; `tuned_config`'s xla_options, which
dispatch takes from KernelTuning.xla_options). Everything else is the XLA dot.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .attention_reference import _precision
from .stacking import as_stack, check_layer, clamp_layer, layer_index, one_layer, split_row
from .tables import read_device_table, table_file

try:  # The Triton lowering is deprecated in jax 0.11 and may disappear later.
    from jax.experimental.pallas import triton as pltriton
except ImportError:  # pragma: no cover - depends on the installed jax
    pltriton = None

__all__ = ["matmul", "matmul_reference", "kernel_path", "swiglu", "Int8Weight", "quantize_int8", "MatmulConfig",
           "default_matmul_config", "deterministic_config", "grouped_config", "grouped_matmul", "group_rows",
           "matmul_plan", "tuned_config", "matmul_table", "IMPLS"]

IMPLS = ("xla", "pallas", "triton", "pallas_interpret")
MAX_ROWS = 128          # the kernel holds all rows of x in one tile
PROLOGUES = (None, "swiglu", "rmsnorm")
TABLE_PATH = Path(__file__).with_name("matmul_configs.json")


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    block_n: int = 64       # output columns per program
    block_k: int = 128      # K rows of w per pipeline step
    num_warps: int = 4
    num_stages: int = 4
    split_k: int = 1        # K parts (float32 partials + one XLA sum when > 1)
    # Rows just above a power of two (65 = 64 + 1: a budget-64 verify) as that power's tile plus
    # a 16-row tail tile, both fed by each weight tile: 80 rows of MMA work instead of 128.
    tail_rows: bool = True
    # Swap the operands: each step accumulates w_tile^T @ x_tile^T ([block_n, rows]) and the
    # accumulator is transposed once at the end. The weight tile then fills the MMA's M side
    # (Hopper's wgmma is 64 rows a warpgroup; 16-row x tiles waste most of it) and the few rows
    # of x its N side (multiples of 8): cuBLAS's skinny kernels do the same ("swap AB").
    swap_ab: bool = False
    # 0: the row tile follows the row count (a power of two, and the tail tile). > 0: rows in fixed
    # tiles of this many, each its own MMA fed by every weight tile, and a row grid past MAX_ROWS:
    # a row's result then depends on nothing but its own inputs (the deterministic mode).
    row_tile: int = 0

    def __post_init__(self):  # tables store the flags as 0/1
        object.__setattr__(self, "tail_rows", bool(self.tail_rows))
        object.__setattr__(self, "swap_ab", bool(self.swap_ab))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Int8Weight:
    """A weight [K, N] stored as int8 with one float32 scale per output column: w = q * scale.

    For the drafter (its proposals only steer acceptance, never the output: the target verifies
    every token): half the bytes a round reads for it. The kernel loads int8 tiles, converts them
    in registers and scales the accumulated columns once; XLA's path dequantizes then multiplies.
    """

    q: jax.Array        # int8 [K, N]
    scale: jax.Array    # float32 [N]

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.size + 4 * self.scale.size


def quantize_int8(w: jax.Array) -> Int8Weight:
    """Symmetric per-column int8: scale = max |w[:, j]| / 127 (1 for an all-zero column), q = round(w / scale)."""
    w32 = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w32), axis=0)
    scale = jnp.where(amax > 0, amax / 127.0, 1.0)
    q = jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8)
    return Int8Weight(q, scale)


def _check_matmul_entry(path: str, kind: str, e) -> None:
    nfields = len(dataclasses.fields(MatmulConfig))
    ok = isinstance(e, dict) and {"k", "n", "rows", "config"} <= set(e) and len(e["rows"]) == 2 \
        and 1 <= len(e["config"]) <= nfields and e.get("prologue") in PROLOGUES and e.get("weight") in (None, "int8") \
        and isinstance(e.get("xla_options", {}), dict)
    if not ok:
        raise ValueError(f"matmul table {path}, {kind}: entry {e} needs k, n, rows [lo, hi] and a config "
                         f"of at most {nfields} MatmulConfig fields in order (prologue {PROLOGUES[1:]}, "
                         "weight 'int8' and xla_options {option: value} optional); fix the entry")


def matmul_table(path: str | Path | None = None) -> dict:
    """The skinny-matmul table at `path` (None: the shipped one, beside this file), every entry
    checked (once per file); ValueError names the file and what is wrong."""
    path, shipped = table_file(path, TABLE_PATH)
    return read_device_table(path, "matmul", _check_matmul_entry, shipped)


def tuned_config(m: int, k: int, n: int, device_kind: str | None = None, prologue: str | None = None,
                 weight: str | None = None, table: dict | None = None,
                 xla_options: dict | None = None) -> MatmulConfig | None:
    """The measured-faster config for x [m, k] @ w [k, n] (with that prologue; weight "int8"
    for an Int8Weight) on this device kind (None: no entries), or None (XLA was as fast, or the
    shape was never timed). table: the shipped one by default (a tool passes another, e.g.
    matmul_table(path)). An entry with `xla_options` counts only where the executable's
    `xla_options` include them all."""
    if device_kind is None:
        return None
    in_effect = xla_options or {}
    for e in (matmul_table() if table is None else table).get(device_kind, ()):
        lo, hi = e["rows"]
        needs = e.get("xla_options", {})
        if any(in_effect.get(name, object()) != value for name, value in needs.items()):
            continue
        if (e["k"], e["n"], e.get("prologue"), e.get("weight")) == (k, n, prologue, weight) and lo <= m <= hi:
            return MatmulConfig(*e["config"])
    return None


def _pow2_at_least(n: int, lo: int = 1) -> int:
    return max(lo, 1 << max(0, (n - 1).bit_length()))


def default_matmul_config(m: int, k: int, n: int) -> MatmulConfig:
    """Untuned starting point: ~128+ programs for the 8B shapes, 64-column slabs.

    Column slabs wider than the row tile keep the re-reads of x (every program reads all of it,
    from L2) below the weight bytes; split_k makes up the programs narrow N lacks.
    """
    bn = 128 if n >= 128 * 128 else 64
    programs = pl.cdiv(n, bn)
    split = 1
    while programs * split < 128 and k // (split * 2) >= 512 and (k // (split * 2)) % 128 == 0:
        split *= 2
    # a [rows, block_k] x tile per stage beside the [block_k, block_n] weight tile: narrower steps
    # for the 128-row tile (rows 65-80 take a 64-row tile plus the 16-row tail)
    return MatmulConfig(block_n=bn, block_k=128 if m <= 80 else 64, num_warps=4, num_stages=4,
                        split_k=split)


DETERMINISTIC_ROW_TILE = 16
DETERMINISTIC_PROGRAMS = 256  # about two per SM of an H100 (132)
# Shared memory a fixed-row-tile program's pipeline may fill (its num_stages - 1 buffered steps of
# one weight tile and every x tile): Hopper gives a block 227 KiB, and the epilogue takes the rest.
ROW_TILE_SMEM_BYTES = 160 * 1024


def deterministic_config(k: int, n: int) -> MatmulConfig:
    """The deterministic mode's config for x [m, k] @ w [k, n], whatever m: every row in a
    16-row tile of its own MMA, a fixed K step (the largest power of two <= 128 dividing k, so
    that any k the models have fits) and a split count fixed by (k, n), its parts summed in one
    order, so a row's sum runs the same way in a one-row step and in a verify of any size.
    swap_ab puts the weight tile on the MMA's M side and the 16 rows on its N side: one
    instruction shape for every tile, and each weight tile is read once for all the rows of a
    program (up to MAX_ROWS). 64-column slabs (128-byte weight rows), and K split in halves
    while there are fewer than DETERMINISTIC_PROGRAMS programs and a part keeps >= 1024 rows of
    K: a one-row product reads its weight at the card's rate only with enough programs in flight."""
    bk = 128
    while bk > 16 and k % bk:
        bk //= 2
    bn = 64
    split = 1
    while (pl.cdiv(n, bn) * split < DETERMINISTIC_PROGRAMS and k % (2 * split * bk) == 0
           and k // (2 * split) >= 1024):
        split *= 2
    return MatmulConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=4, split_k=split, tail_rows=False,
                        swap_ab=True, row_tile=DETERMINISTIC_ROW_TILE)


def grouped_config(k: int, n: int) -> MatmulConfig:
    """An MoE's grouped expert product (`grouped_matmul`): the deterministic config with K whole.
    Its row blocks (one a touched expert, at least min(E, rows) of them) keep the card busy
    without a split, and a split's float32 partials would be written for every block, empty
    ones included. Fixed by (k, n) alone, so a row's bits do not depend on the pass either."""
    return dataclasses.replace(deterministic_config(k, n), split_k=1)


@dataclasses.dataclass(frozen=True)
class MatmulPlan:
    block_m: int        # the main row tile (a power of two >= 16)
    tail_m: int         # 0, or 16: a second row tile for rows block_m .. m-1
    block_n: int
    block_k: int
    split_k: int
    steps: int          # block_k steps per split
    col_blocks: int
    # (first row, rows) of each row tile a program holds, relative to its row block
    tiles: tuple[tuple[int, int], ...] = ()
    row_blocks: int = 1  # programs along the rows (> 1 only with a fixed row_tile)

    @property
    def rows_per_block(self) -> int:
        return sum(h for _, h in self.tiles)


def row_tiles_per_block(cfg: MatmulConfig, k: int, itemsize: int = 2, x_streams: int = 1) -> int:
    """Row tiles a program of a fixed-row-tile config holds: up to MAX_ROWS rows, fewer where the
    pipeline's buffers (each K step: a [block_k, block_n] weight tile and x_streams [row_tile,
    block_k] x tiles per row tile, swiglu's gate and up being two) would pass ROW_TILE_SMEM_BYTES.
    A row's product is its own tile's MMA whatever the count, so the count changes no bits."""
    bk, buffers = min(cfg.block_k, k), max(1, cfg.num_stages - 1)
    w_tile, x_tile = bk * cfg.block_n * itemsize, x_streams * cfg.row_tile * bk * itemsize
    return max(1, min(MAX_ROWS // cfg.row_tile, (ROW_TILE_SMEM_BYTES // buffers - w_tile) // x_tile))


def matmul_plan(m: int, k: int, n: int, cfg: MatmulConfig, *, itemsize: int = 2, x_streams: int = 1) -> MatmulPlan:
    """The static launch shape for x [m, k] @ w [k, n] (x's element size `itemsize`; x_streams 2
    for the swiglu prologue's gate and up); raises ValueError for shapes it cannot take."""
    why = _unsupported(m, k, n, cfg)
    if why:
        raise ValueError(f"the Pallas matmul cannot take [{m}, {k}] @ [{k}, {n}]: {why}; use impl='xla'")
    bk = min(cfg.block_k, k)
    common = dict(block_n=cfg.block_n, block_k=bk, split_k=cfg.split_k, steps=k // (bk * cfg.split_k),
                  col_blocks=pl.cdiv(n, cfg.block_n))
    if cfg.row_tile:
        rt = cfg.row_tile
        per_block = min(pl.cdiv(m, rt), row_tiles_per_block(cfg, k, itemsize, x_streams))
        return MatmulPlan(block_m=rt, tail_m=0, tiles=tuple((i * rt, rt) for i in range(per_block)),
                          row_blocks=pl.cdiv(m, per_block * rt), **common)
    bm, tail = _pow2_at_least(m, 16), 0
    if cfg.tail_rows and bm >= 64 and m - bm // 2 <= 16:
        bm, tail = bm // 2, 16
    return MatmulPlan(block_m=bm, tail_m=tail, tiles=((0, bm),) + (((bm, tail),) if tail else ()), **common)


def _unsupported(m: int, k: int, n: int, cfg: MatmulConfig) -> str | None:
    if m == 0 or k == 0 or n == 0:
        return "empty operand"
    if m > MAX_ROWS and not cfg.row_tile:
        return f"{m} rows > {MAX_ROWS}"
    for name, v in (("block_n", cfg.block_n), ("block_k", cfg.block_k), ("split_k", cfg.split_k),
                    ("row_tile", cfg.row_tile or 1)):
        if v < 1 or v & (v - 1):
            return f"{name} {v} is not a power of two"
    bk = min(cfg.block_k, k)
    if bk & (bk - 1):
        return f"K = {k} is below block_k and not a power of two"
    if k % (bk * cfg.split_k):
        return f"K = {k} is not a multiple of block_k x split_k = {bk * cfg.split_k}"
    if (max(m, 16) + (MAX_ROWS if cfg.row_tile else 0)) * k >= 2**31 or k * n >= 2**31:
        return "operand too large for the kernel's int32 offsets"
    return None


def swiglu(x: jax.Array) -> jax.Array:
    """silu(gate) * up of x = [gate ; up] along the last axis (the fused gate_up projection's
    output), in x.dtype: the MLP's activation, the input of its down projection."""
    gate, up = jnp.split(x, 2, axis=-1)
    return jax.nn.silu(gate) * up


def _rms_scale(x: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)


def _check_norm(prologue: str | None, norm_w, norm_layer, k: int) -> None:
    """ValueError, one line, for a norm weight that does not go with the call."""
    if (prologue == "rmsnorm") != (norm_w is not None):
        raise ValueError("matmul: norm_w goes with prologue='rmsnorm' (and only with it)")
    if norm_layer is not None and prologue != "rmsnorm":
        raise ValueError("matmul: norm_layer goes with prologue='rmsnorm' and a stacked norm_w [L, K]")
    if norm_w is None:
        return
    if norm_layer is None:
        if norm_w.shape != (k,):
            raise ValueError(f"matmul: norm_w {tuple(norm_w.shape)} is not [K = {k}]"
                             + (" (a stacked [L, K] one needs norm_layer)" if norm_w.ndim == 2 else ""))
        return
    if norm_w.ndim != 2 or norm_w.shape[1] != k or norm_w.shape[0] < 1:
        raise ValueError(f"matmul: norm_layer needs norm_w stacked as [L, K = {k}], got {tuple(norm_w.shape)}")
    check_layer(norm_layer, norm_w.shape[0],
                f"matmul: norm_layer {norm_layer} is outside [0, {norm_w.shape[0]}) of norm_w's layers",
                name="matmul: norm_layer")


def matmul_reference(x: jax.Array, w, out_dtype=None, prologue: str | None = None, *, norm_w=None,
                     eps: float = 1e-6, residual=None, norm_layer=None) -> jax.Array:
    """The XLA path, the same ops as the models' own dots: one einsum, in x.dtype (XLA
    accumulates in float32), or with preferred_element_type when out_dtype differs (the LM head's
    float32 logits). prologue "swiglu": the einsum of swiglu(x); "rmsnorm": of the RMSNorm of x
    with weight norm_w [K] (layers.rms_norm's math), or row norm_layer of a stacked norm_w
    [L, K] (`one_layer`: a traced index is clamped into [0, L), as the kernel's). An Int8Weight:
    the float32 product with its int8 values (exact in x's dtype), scaled per column. residual:
    residual + the product, in the output dtype (as `x + linear(...)` in the models). norm_w may
    be a StackedRow (its stack and layer), as in `matmul`."""
    norm_w, norm_layer = split_row(norm_w, norm_layer)
    _check_norm(prologue, norm_w, norm_layer, w.shape[0])
    if prologue == "swiglu":
        x = swiglu(x)
    elif prologue == "rmsnorm":
        norm_w = one_layer(norm_w, norm_layer)
        x = norm_w.astype(x.dtype) * (x.astype(jnp.float32) * _rms_scale(x, eps)).astype(x.dtype)
    if isinstance(w, Int8Weight):
        y = jnp.einsum("...i,io->...o", x, w.q.astype(x.dtype), preferred_element_type=jnp.float32) * w.scale
        y = y.astype(x.dtype if out_dtype is None else out_dtype)
    elif out_dtype is None or jnp.dtype(out_dtype) == x.dtype:
        y = jnp.einsum("...i,io->...o", x, w.astype(x.dtype))
    else:
        y = jnp.einsum("...i,io->...o", x, w.astype(x.dtype), preferred_element_type=out_dtype)
    return y if residual is None else residual + y.astype(residual.dtype)


def _and(a, b):
    return a if b is None else (b if a is None else a & b)


def _kernel(*refs, m: int, n: int, plan: MatmulPlan, precision, swiglu_in: bool, scaled: bool, norm: bool,
            eps: float, residual: bool, swap: bool = False, n_layers: int = 1, grouped: bool = False):
    """One (column block, K part): o[:m, cols] (+)= x[:m, part] @ w[part, cols].

    Refs: x [BM + TM, K] (rows >= m masked: they load as 0 and move no bytes; with a fixed
    row tile, this program's row block of plan.tiles), w [K, BN]
    (columns >= n masked in the last block only), then scale [BN] (scaled), norm_w [L, K] and
    layer [] (norm: every layer's norm weight and the one to apply, read at run time so that one
    compiled kernel serves every layer; n_layers = L), residual [BM + TM, BN] (residual); out
    [BM + TM, BN] (or the part's float32 partial). Rows [0, BM) are one tile, rows [BM, BM + TM)
    the tail tile; each weight tile loaded feeds both.
    swiglu_in: x is [BM + TM, 2K] = [gate ; up] and the x tile is silu(gate) * up, in float32
    rounded to x's dtype (as the XLA fusion). scaled: w holds int8 values and scale their
    per-column float32 scales, applied to the accumulated columns. norm: the x tile is
    x * norm_w[layer] (rounded to x's dtype) and the accumulated rows are scaled by
    rsqrt(mean(x^2) + eps), the mean taken over the K columns this program streams anyway
    (RMSNorm's scale is per row, so it commutes with the product; with split_k > 1 each part
    first sums the squares over all of K, then scales its partial).
    residual: out = residual + (the product
    rounded to the output dtype), rounded again (the models' `x + linear(...)`). swap: the
    accumulators are [BN, rows] (w_tile^T @ x_tile^T), transposed once after the K loop.
    """
    refs = list(refs)
    x_ref, w_ref = refs.pop(0), refs.pop(0)
    group_ref = refs.pop(0) if grouped else None
    scale_ref = refs.pop(0) if scaled else None
    nw_ref, layer_ref = (refs.pop(0), refs.pop(0)) if norm else (None, None)
    r_ref = refs.pop(0) if residual else None
    o_ref = refs.pop(0)
    bn, bk = plan.block_n, plan.block_k
    tiles = plan.tiles
    if plan.row_blocks > 1:   # the last row block runs past m: every tile masks at run time
        row0 = pl.program_id(2) * plan.rows_per_block
        rows_ok = [(row0 + jnp.arange(r0, r0 + h, dtype=jnp.int32) < m)[:, None] for r0, h in tiles]
    else:
        rows_ok = [(jnp.arange(r0, r0 + h, dtype=jnp.int32) < m)[:, None] if r0 + h > m else None
                   for r0, h in tiles]
    cols_ok = None
    if n % bn:
        cols_ok = (pl.program_id(0) * bn + jnp.arange(bn, dtype=jnp.int32) < n)[None, :]
    k0 = pl.program_id(1) * (plan.steps * bk)
    k_total = w_ref.shape[-2]
    steps = plan.steps
    w_rows = lambda ks: w_ref.at[ks, :]  # noqa: E731
    if grouped:   # this row block's expert, read at run time; -1: an empty block, no weight read
        expert = group_ref[()]
        e = jnp.clip(expert, 0, w_ref.shape[0] - 1)
        w_rows = lambda ks: w_ref.at[e, ks, :]  # noqa: E731  (one indexer: the lowering takes no chain)
        steps = jnp.where(expert >= 0, jnp.int32(steps), jnp.int32(0))
    layer = clamp_layer(layer_ref[()], n_layers) if norm else None
    # split: a row's mean of squares needs all of K, which every part reads from x first (x is
    # small and in L2), in the order of the unsplit loop; the parts' products then take its scale
    whole_row_ss = norm and plan.split_k > 1

    def sum_sq(ss, x32):  # a row's running sum of squares, one K step at a time
        return ss + jnp.sum(x32 * x32, axis=1)

    def row_ss(i, sss):
        ks = pl.ds(pl.multiple_of(i * bk, bk), bk)
        return tuple(sum_sq(ss, pltriton.load(x_ref.at[pl.ds(r0, h), ks], mask=ok,
                                              other=None if ok is None else 0.0).astype(jnp.float32))
                     for (r0, h), ok, ss in zip(tiles, rows_ok, sss))

    def step(i, carry):
        accs, sss = carry
        ks = pl.ds(pl.multiple_of(k0 + i * bk, bk), bk)
        wt = pltriton.load(w_rows(ks), mask=cols_ok, other=None if cols_ok is None else 0.0)
        nw = nw_ref[layer, ks].astype(jnp.float32) if norm else None
        out, out_ss = [], []
        for (r0, h), ok, acc, ss in zip(tiles, rows_ok, accs, sss):
            xt = pltriton.load(x_ref.at[pl.ds(r0, h), ks], mask=ok, other=None if ok is None else 0.0)
            if swiglu_in:
                ks_up = pl.ds(pl.multiple_of(k_total + k0 + i * bk, bk), bk)
                up = pltriton.load(x_ref.at[pl.ds(r0, h), ks_up], mask=ok, other=None if ok is None else 0.0)
                g32 = xt.astype(jnp.float32)
                xt = (g32 / (1.0 + jnp.exp(-g32)) * up.astype(jnp.float32)).astype(xt.dtype)
            if norm:
                x32 = xt.astype(jnp.float32)
                if not whole_row_ss:
                    ss = sum_sq(ss, x32)
                xt = (x32 * nw[None, :]).astype(xt.dtype)
            wx = wt.astype(xt.dtype)
            # swap: [BN, h] += w_tile^T @ x_tile^T; else [h, BN] += x_tile @ w_tile
            lhs, rhs, dims = (wx, xt, (((0,), (1,)), ((), ()))) if swap else (xt, wx, (((1,), (0,)), ((), ())))
            out.append(acc + lax.dot_general(lhs, rhs, dims, precision=precision,
                                             preferred_element_type=jnp.float32))
            out_ss.append(ss)
        return tuple(out), tuple(out_ss)

    zeros = (tuple(jnp.zeros((bn, h) if swap else (h, bn), jnp.float32) for _, h in tiles),
             tuple(jnp.zeros((h,), jnp.float32) for _, h in tiles))
    if whole_row_ss:
        zeros = (zeros[0], lax.fori_loop(0, k_total // bk, row_ss, zeros[1]))
    accs, sss = lax.fori_loop(0, steps, step, zeros)
    if swap:
        accs = tuple(acc.T for acc in accs)
    if scaled:
        col_scale = pltriton.load(scale_ref, mask=None if cols_ok is None else cols_ok[0],
                                  other=None if cols_ok is None else 0.0)
        accs = tuple(acc * col_scale[None, :] for acc in accs)
    if norm:
        accs = tuple(acc * lax.rsqrt(ss / k_total + eps)[:, None] for acc, ss in zip(accs, sss))
    for (r0, h), ok, acc in zip(tiles, rows_ok, accs):
        mask = _and(ok, cols_ok)
        if grouped:   # an empty block's rows are never read: nothing stored
            mask = _and(mask, jnp.full((h, bn), expert >= 0))
        y = acc.astype(o_ref.dtype)
        if residual:
            r = pltriton.load(r_ref.at[pl.ds(r0, h), :], mask=mask, other=None if mask is None else 0.0)
            y = (r.astype(jnp.float32) + y.astype(jnp.float32)).astype(o_ref.dtype)
        pltriton.store(o_ref.at[pl.ds(r0, h), :], y, mask=mask)


def _matmul_pallas(x2: jax.Array, w, out_dtype, cfg: MatmulConfig, interpret: bool,
                   prologue: str | None = None, norm_w=None, eps: float = 1e-6, residual=None, norm_layer=None,
                   groups=None):
    """The kernel's call; norm_w [K], or [L, K] with norm_layer (an int or an int32 scalar).
    groups (int32 [m / row_tile]): w is a stack [E, K, N] and row block r (one row tile) takes
    w[groups[r]] (-1: none, the block's rows are left unwritten)."""
    m, kx = x2.shape
    k, n = w.shape[-2:]
    plan = matmul_plan(m, k, n, cfg, itemsize=x2.dtype.itemsize, x_streams=2 if prologue == "swiglu" else 1)
    if groups is not None:
        plan = dataclasses.replace(plan, tiles=((0, cfg.row_tile),), row_blocks=m // cfg.row_tile)
    bm, bn = plan.rows_per_block, plan.block_n
    split = plan.split_k > 1
    scaled = isinstance(w, Int8Weight)
    norm = prologue == "rmsnorm"
    if norm:
        norm_layer, norm_w = as_stack(norm_layer, norm_w)
    n_layers = norm_w.shape[0] if norm else 1
    fuse_residual = residual is not None and not split
    kernel = lambda *refs: _kernel(*refs, m=m, n=n, plan=plan, precision=_precision(x2.dtype),  # noqa: E731
                                   swiglu_in=prologue == "swiglu", scaled=scaled, norm=norm, eps=eps,
                                   residual=fuse_residual, swap=cfg.swap_ab, n_layers=n_layers,
                                   grouped=groups is not None)
    if split:
        out_spec = pl.BlockSpec((None, bm, bn), lambda j, s, r: (s, r, j))
        out_shape = jax.ShapeDtypeStruct((plan.split_k, m, n), jnp.float32)
    else:
        out_spec = pl.BlockSpec((bm, bn), lambda j, s, r: (r, j))
        out_shape = jax.ShapeDtypeStruct((m, n), out_dtype)
    params = None
    if not interpret:
        params = pltriton.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    specs = [pl.BlockSpec((bm, kx), lambda j, s, r: (r, 0))]      # all rows (of a row block): masked
    if groups is None:
        specs.append(pl.BlockSpec((k, bn), lambda j, s, r: (0, j)))
        args = [x2] + ([w.q, w.scale] if scaled else [w])
    else:   # every expert's column slab; the program reads its block's expert at run time
        specs += [pl.BlockSpec((w.shape[0], k, bn), lambda j, s, r: (0, 0, j)),
                  pl.BlockSpec((None,), lambda j, s, r: (r,))]
        args = [x2, w, groups.astype(jnp.int32)]
    if scaled:
        specs.append(pl.BlockSpec((bn,), lambda j, s, r: (j,)))
    if norm:
        # every layer's weight (the programs stream their K steps of row `layer`) and the layer
        specs += [pl.BlockSpec((n_layers, k), lambda j, s, r: (0, 0)), pl.BlockSpec((None,), lambda j, s, r: (0,))]
        args += [norm_w, layer_index(norm_layer)]
    if fuse_residual:
        specs.append(pl.BlockSpec((bm, bn), lambda j, s, r: (r, j)))
        args.append(residual)
    y = pl.pallas_call(
        kernel,
        grid=(plan.col_blocks, plan.split_k, plan.row_blocks),
        in_specs=specs,
        out_specs=out_spec,
        out_shape=out_shape,
        compiler_params=params,
        interpret=interpret,
        name="skinny_matmul_int8" if scaled else "skinny_matmul",
    )(*args)
    if not split:
        return y
    total = y[0]
    for part in range(1, plan.split_k):  # one fixed order, whatever the rows: a row's bits are its own
        total = total + y[part]
    y = total.astype(out_dtype)
    return y if residual is None else residual + y.astype(residual.dtype)


def grouped_matmul(x: jax.Array, w: jax.Array, groups: jax.Array, *, config: MatmulConfig, interpret: bool = False,
                   out_dtype=None, prologue: str | None = None) -> jax.Array:
    """Row block r of x [R * row_tile, K] (2K with the swiglu prologue) times w[groups[r]] of the
    stack w [E, K, N]: an MoE's experts with each expert's rows gathered into whole row tiles
    (groups[r] = -1: an empty block: no weight read, its output rows left unwritten, undefined).
    config must have a row_tile (the deterministic mode's): a row's product is then what `matmul`
    with that config computes for it alone, wherever its tile lies. Returns [R * row_tile, N] in
    out_dtype (default x.dtype)."""
    rt = config.row_tile
    if not rt or x.shape[0] % rt or groups.shape != (x.shape[0] // rt,) or w.ndim != 3:
        raise ValueError(f"grouped_matmul: x {x.shape} must be whole row tiles of a config's row_tile ({rt}), "
                         f"groups {groups.shape} one expert a tile and w [E, K, N] ({w.shape})")
    if prologue not in (None, "swiglu"):
        raise ValueError(f"grouped_matmul takes the swiglu prologue or none, not {prologue!r}")
    why = _unsupported(x.shape[0], w.shape[1], w.shape[2], config)
    if why:
        raise ValueError(f"grouped_matmul cannot take {x.shape} @ {w.shape}: {why}")
    if not interpret and pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton)")
    out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)
    return _matmul_pallas(x, w.astype(x.dtype), out_dtype, config, interpret, prologue=prologue, groups=groups)


# group_rows by comparisons up to this many (a row, an expert or a row tile) pairs
GROUP_BY_COMPARISON = 1 << 20


def group_rows(experts: jax.Array, num_experts: int, tile: int) -> tuple[jax.Array, jax.Array]:
    """The layout `grouped_matmul` takes for rows with experts [A] (int32 in [0, E)): (dest int32
    [A], the row each goes to, and groups int32 [R], each row tile's expert or -1), the rows of
    an expert together in its own tiles, in their order. R = ceil(A / tile) + min(E, A) (static:
    every expert's last tile may be part-filled)."""
    a = experts.shape[0]
    r = pl.cdiv(a, tile) + min(num_experts, a)
    small = a * max(a, num_experts, r) <= GROUP_BY_COMPARISON
    if small:  # comparisons, a few fusions, where a sort and scatters would be a dozen small kernels
        counts = jnp.sum(experts[:, None] == jnp.arange(num_experts, dtype=experts.dtype), axis=0, dtype=jnp.int32)
    else:
        counts = jnp.zeros((num_experts,), jnp.int32).at[experts].add(1)
    tiles = (counts + tile - 1) // tile
    tile_end = jnp.cumsum(tiles)
    first_row = (tile_end - tiles) * tile                              # each expert's first row
    if small:
        i = jnp.arange(a, dtype=jnp.int32)
        earlier_same = (experts[None, :] == experts[:, None]) & (i[None, :] < i[:, None])
        dest = first_row[experts] + jnp.sum(earlier_same, axis=1, dtype=jnp.int32)
        groups = jnp.sum(tile_end[None, :] <= jnp.arange(r, dtype=jnp.int32)[:, None], axis=1, dtype=jnp.int32)
    else:
        first_seen = jnp.cumsum(counts) - counts                       # its first row in expert order
        order = jnp.argsort(experts, stable=True)
        e_sorted = experts[order]
        rank = jnp.arange(a, dtype=jnp.int32) - first_seen[e_sorted]
        dest = jnp.zeros((a,), jnp.int32).at[order].set(first_row[e_sorted] + rank)
        groups = jnp.searchsorted(tile_end, jnp.arange(r, dtype=jnp.int32), side="right").astype(jnp.int32)
    return dest, jnp.where(groups < num_experts, groups, -1)


def _resolve(impl: str, m: int, k: int, n: int, cfg: MatmulConfig | None) -> tuple[str, MatmulConfig]:
    """(path, config) of one call: path xla, pallas or pallas_interpret; cfg None: the default."""
    if impl not in IMPLS:
        raise ValueError(f"unknown matmul impl {impl!r}; choose one of {IMPLS} "
                         "(\"auto\" is chosen per device by ddtree_jax.kernels.dispatch)")
    cfg = cfg or default_matmul_config(m, k, n)
    if impl == "triton":
        impl = "pallas"
    if impl == "pallas" and pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); use impl='xla'")
    # A forward mixes shapes (a prompt's rows, a verify's): the kernel takes those it can.
    return ("xla" if impl != "xla" and _unsupported(m, k, n, cfg) else impl), cfg


def _plan_call(x_shape, w, impl: str, config: MatmulConfig | None, prologue: str | None):
    """(path, config, m, k, n, kx) of a call, after the argument checks."""
    k, n = w.shape
    if prologue not in PROLOGUES:
        raise ValueError(f"unknown matmul prologue {prologue!r}; one of {PROLOGUES}")
    kx = 2 * k if prologue == "swiglu" else k
    if x_shape[-1] != kx:
        raise ValueError(f"matmul: x [..., {x_shape[-1]}] does not match w [{k}, {n}]"
                         + (" (swiglu takes [gate ; up]: 2K columns)" if prologue == "swiglu" else ""))
    m = math.prod(x_shape[:-1])
    path, cfg = _resolve(impl, m, k, n, config)
    if path != "xla" and prologue == "rmsnorm" and cfg.split_k > 1 and not cfg.row_tile:
        cfg = dataclasses.replace(cfg, split_k=1)  # tuned tiles: a program's K range is the whole row
    return path, cfg, m, k, n, kx


def kernel_path(x_shape, w, impl: str = "xla", config: MatmulConfig | None = None,
                prologue: str | None = None) -> str:
    """"xla", "pallas" or "pallas_interpret": the path `matmul` takes for these arguments (the
    models fuse norms and residual adds into the product only where it is the kernel's)."""
    return _plan_call(x_shape, w, impl, config, prologue)[0]


def matmul(x: jax.Array, w: "jax.Array | Int8Weight", *, out_dtype=None, impl: str = "xla",
           config: MatmulConfig | None = None, prologue: str | None = None, norm_w: jax.Array | None = None,
           eps: float = 1e-6, residual: jax.Array | None = None, norm_layer=None) -> jax.Array:
    """x [..., K] @ w [K, N] -> [..., N] in out_dtype (default x.dtype), float32 accumulation.

    prologue "swiglu": x is [..., 2K] = [gate ; up] and the product is swiglu(x) @ w (the MLP's
    down projection straight from the gate_up output: the activation is never written).
    prologue "rmsnorm": the product is rms_norm(x, norm_w, eps) @ w (the normed activation is
    never written; in the kernel the row scale is applied to the accumulated product).
    norm_layer (a Python int, or an integer scalar, possibly traced): norm_w is every layer's
    stacked [L, K] and its row norm_layer the norm weight; the kernel reads the layer at run time,
    so every layer of a forward calls one compiled kernel (a traced index is clamped into [0, L),
    as XLA's dynamic index; a Python int outside it is a ValueError). norm_w may also be a
    StackedRow(stacked, layer) (ddtree_jax.kernels.stacking: what the models pass), with no
    norm_layer. Path and config depend on x's and w's shapes only, never on norm_w's.
    residual [..., N]: residual + the product, in residual's dtype (a decoder's residual add).

    impl: "xla" | "pallas" (= "triton") | "pallas_interpret" (CPU tests): the kernel wherever it
    fits (at most MAX_ROWS rows, K a multiple of block_k x split_k), the XLA dot for the other
    shapes. config: the kernel's tiles (None: default_matmul_config). The models go through
    dispatch.matmul, which picks impl and config (the tuned table's) per device.
    """
    out_dtype = x.dtype if out_dtype is None else jnp.dtype(out_dtype)
    norm_w, norm_layer = split_row(norm_w, norm_layer)
    if prologue in PROLOGUES:            # (an unknown prologue: _plan_call's error)
        _check_norm(prologue, norm_w, norm_layer, w.shape[0])
    path, cfg, m, k, n, kx = _plan_call(x.shape, w, impl, config, prologue)
    lead = x.shape[:-1]
    if residual is not None and residual.shape != (*lead, n):
        raise ValueError(f"matmul: residual {residual.shape} does not match the output {(*lead, n)}")
    if path == "xla":
        return matmul_reference(x, w, out_dtype, prologue, norm_w=norm_w, eps=eps, residual=residual,
                                norm_layer=norm_layer)
    if not isinstance(w, Int8Weight):
        w = w.astype(x.dtype)
    y = _matmul_pallas(x.reshape(m, kx), w, out_dtype, cfg, interpret=path == "pallas_interpret",
                       prologue=prologue, norm_w=norm_w, eps=eps, norm_layer=norm_layer,
                       residual=None if residual is None else residual.reshape(m, n))
    return y.reshape(*lead, n)
