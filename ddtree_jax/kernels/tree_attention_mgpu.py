"""Tree-verify attention for Hopper as one Mosaic GPU kernel: TMA loads, wgmma, warp specialization.

Why a second kernel beside the Triton one (tree_attention.py): at T = 257 tree tokens the verify
attention is FLOP-bound (4 * Hq * T * Dh FLOP per key against 4 * Hkv * Dh bytes), and the
Triton kernel spent ~26 us a layer there against a ~4 us FLOP floor: one warpgroup a program
runs its products, its softmax and its gathered loads one after the other. Here each CTA has one
*memory* warpgroup that streams K/V tiles (and the tree mask's tiles) into shared memory by TMA,
``stages`` steps ahead, and ``compute_wgs`` warpgroups that each own 64 folded query rows and
run wgmma products from shared memory, so loads, tensor-core work and the softmax of the other
warpgroup overlap. With ``split_keys`` the two compute warpgroups share one row block instead
and take alternate key steps, then merge their (acc, max, sum) through shared memory: twice the
warpgroups on a small tree's few row blocks.

Where it runs: dispatch.py hands it a verify on Hopper (KernelTuning.mosaic_t_range: compute
capability 9.0) for padded tree sizes in that range (DDTree-255, -256 and -1024) and at T = 72
(DDTree-64) and T = 16 (the drafter's block, DFlash's verify) where ONE_WAVE_CONFIGS' key split
fits one wave (T = 72 at batch 2: over long caches, LONG_CACHE_CONFIGS); other small trees stay
on Triton. The engine pads those verifies to a multiple of 8 rows (dispatch.verify_rows), since
the tiled TMA boxes of q / K / V need T % 8 == 0. The configs by T are this module's tile logic,
measured with bench/bench_mgpu.py and in rounds; the device's thresholds (SM count, the
long-cache capacity) come in as arguments.

Layout (the same contract as :func:`ddtree_jax.kernels.attention`):

* GQA fold: the G query heads of one kv head share every K/V tile. A warpgroup's 64 rows are
  ``TB = 64 / G`` tree tokens times G heads, head-major: row ``gi * TB + tl`` is token
  ``m * TB + tl`` of query head ``h * G + gi`` (m: the warpgroup's row block). Its q tile is G
  TMA boxes ``q[b, m*TB : m*TB+TB, h*G + gi, :]`` (rows past T come in as zeros) and its output
  goes back in boxes of 8 rows, those past T skipped.
* The cache: every layer's, stacked ``[L, Bt, Hkv, S, Dh]`` (one layer's ``[Bt, Hkv, S, Dh]``
  is a stack of one), viewed as ``[L * Bt, Hkv, S, Dh]``; the layer is an int32 kernel input,
  read at run time, so a forward's layers all call one compiled kernel (a static index would
  lower one a layer), and batch row b's cache rows are row ``layer * Bt + b`` of that view.
* Keys: first the committed prefix ``k_cache[layer, b, h, 0:cache_len]`` in ``block_k`` steps
  (the step count is traced), then the T new keys. The prefix's last block may run past cache_len:
  its scores are masked by position and its V rows zeroed in shared memory before the product,
  so stale cache entries (even NaN or inf) never reach the output.
* The tree mask: an XLA fusion (shared by a forward's layers) expands ``new_mask`` into the
  folded row order as a bf16 {0, 1} array ``[Bt, NG * P * 64, Tn]`` (P: row blocks a CTA); a
  new-key step loads the CTA's ``[P * 64, block_k]`` tile with the keys. A masked key gets
  score -1e30 and probability exactly 0.

Softmax in the exp2 domain, float32 statistics and accumulator, bf16 probabilities into the
value product (as the Triton kernel and attention_reference do).

CPU: the same kernel body runs in Mosaic GPU's interpret mode (``interpret=True``): TMA copies,
barriers and the warpgroups are simulated; the two matrix products and the register layouts are
the only parts swapped (plain dots and plain loads, since the interpreter does not take a
transposed wgmma operand or layout casts). The CUDA lowering of the real path is checked by the
tests too (tests/test_kernels_mgpu.py).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re

import jax
import jax.numpy as jnp
from jax import lax

from . import split_merge
from .attention_reference import check_attention_shapes
from .stacking import as_stack, clamp_layer, layer_index

try:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
except ImportError:  # pragma: no cover - depends on the installed jax
    plgpu = None

__all__ = ["MgpuConfig", "attention_mgpu", "mgpu_unsupported", "fold_mask", "BLOCK_M", "config_for",
           "fitted_config", "parse_config", "prepare_cpu_for_interpret", "wait_if_interpreted"]

BLOCK_M = 64          # folded rows a compute warpgroup owns (one wgmma M tile)
_LOG2E = math.log2(math.e)
_NEG = -1e30          # finite "minus infinity": keeps max / exp2 free of inf - inf

# Interpret mode on the CPU runs each warpgroup of a block as its own CPU computation, in its
# own thread; they meet at barriers, and their host callbacks run eager jax ops. Two deadlocks
# follow on a small machine:
# - XLA's CPU client sizes its thread pools by the core count (PJRT_NPROC overrides it). On 2
#   cores a kernel inside a jitted forward, whose outer computation holds a pool thread, leaves
#   its warpgroups' computations waiting for threads while a peer waits at a barrier for them.
# - The caller enqueues its next op while the kernel still runs (async dispatch); the client
#   orders a device's computations, so a callback's eager op waits behind the caller's op, which
#   waits for the kernel, which waits for the callback. So attention_mgpu waits for an eager
#   interpreted kernel before its merge (wait_if_interpreted). A caller that runs one inside its
#   own jit must wait for that computation before dispatching more (as bench.check_gpu does).
#   Synchronous dispatch (jax_cpu_enable_async_dispatch off) also cures it, but it empties the
#   CPU profiler traces that profile_round's tests read.
INTERPRET_CPU_THREADS = 16


def prepare_cpu_for_interpret(threads: int = INTERPRET_CPU_THREADS) -> None:
    """Ask XLA's CPU client for `threads` pool threads (PJRT_NPROC, unless already set), against
    the first deadlock above. Read when jax's CPU backend starts (its first computation): call
    this first thing in a process that interprets."""
    os.environ.setdefault("PJRT_NPROC", str(threads))


def wait_if_interpreted(out, interpret: bool):
    """An eager interpreted kernel's output, waited for (the second deadlock above); traced
    values and the compiled path pass through."""
    if interpret and not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(out)):
        return jax.block_until_ready(out)
    return out


@dataclasses.dataclass(frozen=True)
class MgpuConfig:
    """Static knobs of the Mosaic GPU attention kernel (written compactly by parse_config)."""
    block_k: int = 64        # keys a step (K, V and mask tiles)
    stages: int = 3          # K/V tiles in flight (shared memory ring)
    compute_wgs: int = 2     # compute warpgroups a CTA
    # False: each compute warpgroup owns its own 64-row block and all keys. True: the CTA's
    # warpgroups share one 64-row block and split its key steps (warpgroup w takes steps
    # j % compute_wgs == w), then merge through shared memory: twice the warpgroups on a few
    # row blocks (a 65-token tree has 5 a kv head) at the cost of the merge.
    split_keys: bool = False
    # Skip a new-key step that no row of the warpgroup's block may see (its mask tile all 0): its
    # products and softmax, not its loads. Exact: such a step would leave (acc, max, sum) as they
    # are. A tree row sees only its ancestors, so a large tree's blocks skip most new-key steps
    # (42-53 % of them hold a visible key at T = 257, 21-28 % at 1025); the per-(block, step)
    # flags are one small XLA reduction of the folded mask.
    skip_empty: bool = False
    # CTAs a row block's keys are split over (N > 1): CTA c of a row block takes the c-th
    # contiguous share of the key steps (prefix then new keys) and writes its normalized partial
    # output (in q's dtype) and its rows' log2-sum-exp; merge_splits (XLA) or, with merge_kernel,
    # a Pallas kernel merges the N partials outside the kernel. N times the CTAs, each walking
    # 1 / N of the steps: for grids too small to fill the GPU (a 16-token drafter block is 8
    # CTAs on the 8B shape, a 65-token tree 40).
    key_splits: int = 1
    # FlashAttention-3's intra-warpgroup overlap on the committed prefix's full key steps: a
    # warpgroup issues step j+1's QK product before step j's softmax, so that the tensor cores run
    # it while the softmax runs (a step's softmax is ~860 cycles, each product ~420). Costs one
    # more K tile held a warpgroup.
    overlap: bool = False
    # The last row-block group of a (batch row, kv head) in its own launch, its keys split over N
    # CTAs (tN; the other groups as configured, before it): where T leaves a last group that
    # would start a second wave. DDTree-256's 264 rows are 17 row blocks of 16 tokens a kv head:
    # 136 CTAs at one block a CTA on 132 SMs, the 17th holding one real token. Costs a second
    # launch, the split's merge and a concatenation of the rows; pays where the prefix is long
    # (DDTree-256: -0.45 ms a call at a 4096-token prompt, +0.25 at 512): LONG_CACHE_CONFIGS.
    tail_splits: int = 1
    # The shares' merge (key_splits, tail_splits) as one Pallas Triton kernel
    # (split_merge.merge_splits_kernel) instead of merge_splits' XLA fusions (two on the H200).
    merge_kernel: bool = False

    @property
    def blocks_per_cta(self) -> int:
        return 1 if self.split_keys else self.compute_wgs

    def smem_bytes(self, dh: int, itemsize: int = 2) -> int:
        """Shared memory of one CTA: q/o tiles, the K/V ring, the mask ring, (split_keys) the
        float32 partials the merge reads and (key_splits) the rows' log2-sum-exp2."""
        q = self.blocks_per_cta * BLOCK_M * dh * itemsize
        kv = 2 * self.stages * self.block_k * dh * itemsize
        mask = self.stages * self.blocks_per_cta * BLOCK_M * self.block_k * itemsize
        merge = (self.compute_wgs - 1) * BLOCK_M * (dh + 2) * 4 if self.split_keys else 0
        lse = self.blocks_per_cta * BLOCK_M * 4 if self.key_splits > 1 else 0
        return q + kv + mask + merge + lse


# Configs by T (None: any other T). 64x3w2s was the fastest at T = 264 and 1032, the overlap (o)
# saves 2-7 % more at T = 264; 64x4w2k is the fastest unsplit config at T = 72. (FlashAttention-3's
# ping-pong between the two compute warpgroups was 2-5 % slower at every T and is not built.)
AUTO_CONFIGS: dict[int | None, MgpuConfig] = {
    72: MgpuConfig(block_k=64, stages=4, compute_wgs=2, split_keys=True),
    None: MgpuConfig(block_k=64, stages=3, compute_wgs=2, skip_empty=True, overlap=True)}
_MERGE_KERNEL = split_merge.pltriton is not None  # the merge kernel wherever this jax has Pallas Triton
# Configs by T that pay only while their grid is one wave, one CTA an SM (batch rows x kv heads
# x CTAs a kv head <= the GPU's SMs; else AUTO_CONFIGS' entry):
# - T = 256 (DDTree-255): one row block a CTA, the keys split between its warpgroups: 128 CTAs
#   on the 8B heads (11.6 against 17.3 us with two blocks a CTA).
# - T = 72 (DDTree-64): 5 row blocks a kv head, one a CTA, keys split over 3 CTAs (120 at batch
#   1), the shares merged by split_merge's kernel: 9.8 against Triton's 12.4 us at prefix 512,
#   19.9 against 29.6 at 4096; DDTree-64 rounds tie Triton's at prompt 512, 3-7 % faster from 2k.
# - T = 16 (the drafter's block, DFlash's verify; verifies of 9-16 rows are padded to 16): one
#   row block a kv head, keys split over 8 CTAs, merged by the kernel (64 CTAs at batch 1): 7.3
#   against Triton's 10.4 us at prefix 512, 11.6 against 20.0 at 4096.
ONE_WAVE_CONFIGS: dict[int, MgpuConfig] = {
    256: MgpuConfig(block_k=64, stages=4, compute_wgs=2, split_keys=True, skip_empty=True),
    72: MgpuConfig(block_k=64, stages=4, compute_wgs=2, split_keys=True, key_splits=3,
                   merge_kernel=_MERGE_KERNEL),
    16: MgpuConfig(block_k=64, stages=4, compute_wgs=2, split_keys=True, key_splits=8,
                   merge_kernel=_MERGE_KERNEL)}
# Configs by T for long caches (KernelTuning.mosaic_long_cache_from positions or more), tried in
# order: the first whose first launch fits LONG_CACHE_WAVES[T] waves (one unless listed; batch rows
# x kv heads x its CTAs a kv head, the tail split's first launch leaving out the last group), a
# second wave at least half full (`fills_waves`); none fits: the rules above. They pay where the prefix is
# long and cost where it is short; the prefix is traced and the config static, so the rule goes
# by the cache's size, which the engine makes bucket(prompt) + bucket(max new tokens) + nodes + 2.
# - T = 264 (DDTree-256) on the 8B heads: 17 row blocks of 16 tokens a kv head, the 17th holding
#   one real token; the tail split runs it in a second launch, its keys over 8 CTAs. At batch 1
#   one block a CTA (the first 16 groups, 128 CTAs: DDTree-256 rounds 5-8 % faster at prompts
#   4k-8k), at batch 2 two blocks a CTA (the first 8 groups: 5-9 % faster).
# - T = 72 (DDTree-64) at batch 2: ONE_WAVE_CONFIGS[72]'s 240 CTAs, two waves, lose over a short
#   cache (4 % slower than Triton at prompt 512) and win over long ones (2-4 % faster from 4k).
LONG_CACHE_CONFIGS: dict[int, tuple[MgpuConfig, ...]] = {
    264: (MgpuConfig(block_k=64, stages=4, compute_wgs=2, split_keys=True, skip_empty=True, tail_splits=8),
          MgpuConfig(block_k=64, stages=3, compute_wgs=2, skip_empty=True, overlap=True, tail_splits=8)),
    72: (ONE_WAVE_CONFIGS[72],)}
LONG_CACHE_WAVES: dict[int, int] = {72: 2}


def parse_config(spec: str) -> MgpuConfig:
    """``BKxSTAGESwWGS[k][s][cN][o][tN][m]`` -> MgpuConfig (k: split_keys, s: skip_empty, cN:
    key_splits N, o: overlap, tN: tail_splits N, m: merge_kernel), e.g. 64x3w2, 64x4w2ks,
    64x4w2kc2, 64x4w2kc3m, 64x4w2kso or 64x4w2kst16: how the bench tools name configs."""
    m = re.fullmatch(r"(\d+)x(\d+)w(\d+)(k?)(s?)(?:c(\d+))?(o?)(?:t(\d+))?(m?)", spec.strip())
    if not m:
        raise ValueError(f"config {spec!r}: give BKxSTAGESwWGS[k][s][cN][o][tN][m] (k: split the keys between the "
                         "warpgroups, s: skip empty new-key steps, cN: split them over N CTAs, o: overlap the next "
                         "QK product with the softmax, tN: the last row-block group's keys over N CTAs in a launch "
                         "of its own, m: merge the shares in one Pallas kernel), e.g. 64x4w2kc3m")
    return MgpuConfig(int(m[1]), int(m[2]), int(m[3]), split_keys=bool(m[4]), skip_empty=bool(m[5]),
                      key_splits=int(m[6] or 1), overlap=bool(m[7]), tail_splits=int(m[8] or 1),
                      merge_kernel=bool(m[9]))


def _grid(t: int, bt: int, hkv: int, g: int, cfg: MgpuConfig, groups: int | None = None) -> tuple[int, int, int]:
    """The kernel's grid (n: row-block groups x key shares, h, b) for T new tokens, Bt batch
    rows, Hkv kv heads and G query heads a kv head; groups: the row-block groups a (batch row,
    kv head) of this launch (default: all of them)."""
    return (groups or _groups(t, g, cfg)[2]) * cfg.key_splits, hkv, bt


def grid_ctas(t: int, bt: int, hkv: int, g: int, cfg: MgpuConfig, groups: int | None = None) -> int:
    """CTAs of that grid (groups: as _grid's)."""
    return math.prod(_grid(t, bt, hkv, g, cfg, groups))


def config_for(t: int, grid: tuple[int, int, int] | None = None, sms: int | None = None,
               seq: int | None = None, long_cache_from: int | None = None) -> MgpuConfig:
    """The kernel's knobs for T new tokens: fitted_config's pick; else AUTO_CONFIGS' entry for
    T; else AUTO_CONFIGS[None]."""
    return fitted_config(t, grid, sms, seq, long_cache_from) or AUTO_CONFIGS.get(t, AUTO_CONFIGS[None])


def fitted_config(t: int, grid: tuple[int, int, int] | None, sms: int | None,
                  seq: int | None, long_cache_from: int | None = None) -> MgpuConfig | None:
    """ONE_WAVE_CONFIGS' entry for T where its grid (Bt, Hkv, G) fits the GPU's `sms` in one
    wave (grid or sms unknown: taken), else long_cache_config's pick; None where neither applies."""
    wave = ONE_WAVE_CONFIGS.get(t)
    if wave is not None and (grid is None or not sms or fills_waves(grid_ctas(t, *grid, wave), sms, 1)):
        return wave
    return long_cache_config(t, grid, sms, seq, long_cache_from)


def long_cache_config(t: int, grid: tuple[int, int, int] | None, sms: int | None,
                      seq: int | None, long_cache_from: int | None) -> MgpuConfig | None:
    """LONG_CACHE_CONFIGS' first entry for T whose first launch fits the GPU's `sms` in
    LONG_CACHE_WAVES[T] waves (default one), where the cache holds `seq` >= `long_cache_from`
    positions (grid: (Bt, Hkv, G)); None where none does or any of the four is unknown."""
    if grid is None or not sms or seq is None or long_cache_from is None or seq < long_cache_from:
        return None
    bt, hkv, g = grid
    for cfg in LONG_CACHE_CONFIGS.get(t, ()):
        if fills_waves(grid_ctas(t, bt, hkv, g, cfg, _head_groups(t, g, cfg)), sms, LONG_CACHE_WAVES.get(t, 1)):
            return cfg
    return None


def fills_waves(ctas: int, sms: int, waves: int) -> bool:
    """Whether `ctas` CTAs, one an SM, run in at most `waves` waves on `sms` SMs, the last at
    least half full where there are more than one: a nearly empty last wave (DDTree-64's 120
    CTAs on a 114-SM GPU) costs a whole CTA's time for a few CTAs' work."""
    n = -(-ctas // sms)
    return n <= waves and (n == 1 or ctas - (n - 1) * sms >= sms / 2)


def mgpu_unsupported(q, k_cache, kv_start=None, config: MgpuConfig | None = None) -> str | None:
    """Why the Mosaic GPU kernel cannot take these inputs (None if it can); k_cache: one
    layer's [Bt, Hkv, S, Dh] (of a stacked cache, a per-layer view)."""
    cfg = config or MgpuConfig()
    if plgpu is None:
        return "this jax has no Mosaic GPU Pallas module"
    if kv_start is not None:
        return "sliding windows (kv_start) are not implemented in the Mosaic GPU kernel"
    if jnp.dtype(q.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return f"dtype {q.dtype} (wgmma takes bf16 / f16 here)"
    bt, t, hq, dh = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    if dh not in (64, 128):
        return f"head dim {dh} (64 or 128)"
    if BLOCK_M % g or (BLOCK_M // g) % 8:
        return f"{g} query heads per kv head (the fold needs 64 / G to be a multiple of 8: G <= 8)"
    if cfg.block_k not in (64, 128) or cfg.stages < 2 or cfg.compute_wgs not in (1, 2):
        return f"config {cfg} (block_k 64 / 128, stages >= 2, compute_wgs 1 / 2)"
    if cfg.split_keys and (cfg.compute_wgs != 2 or cfg.stages % 2):
        # A ring slot must always serve the same warpgroup: each tracks its barriers' phases.
        return f"config {cfg} (split_keys takes 2 compute warpgroups and an even number of stages)"
    if not 1 <= cfg.key_splits <= 64 or not 1 <= cfg.tail_splits <= 64:
        return f"config {cfg} (key_splits and tail_splits 1 to 64)"
    if cfg.key_splits > 1 and cfg.tail_splits > 1:
        return f"config {cfg} (key_splits or tail_splits, not both)"
    if cfg.merge_kernel and split_merge.pltriton is None:
        return f"config {cfg} (m: this jax has no Pallas Triton module for the merge kernel)"
    if cfg.smem_bytes(dh) > 220 * 1024:
        return f"config {cfg} needs {cfg.smem_bytes(dh)} bytes of shared memory"
    if k_cache.shape[2] % 8:
        return (f"a cache of {k_cache.shape[2]} positions (TMA boxes of the tiled K / V need a multiple of 8; "
                "the engine's caches are multiples of 128)")
    if t < 8 or t % 8:
        return (f"T = {t} new tokens (TMA boxes of the tiled q / K / V need T to be a multiple of 8; "
                "the engine pads a tree's verify rows to one: dispatch.verify_rows)")
    return None


def _groups(t: int, g: int, cfg: MgpuConfig) -> tuple[int, int, int]:
    """(tokens a row block TB, row blocks, CTAs a (batch row, kv head) NG)."""
    tb = BLOCK_M // g
    blocks = pl.cdiv(t, tb)
    return tb, blocks, pl.cdiv(blocks, cfg.blocks_per_cta)


def _head_groups(t: int, g: int, cfg: MgpuConfig) -> int:
    """Row-block groups of a (batch row, kv head) in the first launch: all NG, or NG - 1 where
    tail_splits runs the last one in a launch of its own (NG > 1)."""
    ng = _groups(t, g, cfg)[2]
    return ng - 1 if cfg.tail_splits > 1 and ng > 1 else ng


def fold_mask(new_mask, g: int, cfg: MgpuConfig, dtype=jnp.bfloat16):
    """bool [Bt, T, T] -> {0, 1} [Bt, NG * P * 64, Tn] in the kernel's folded row order (P: row
    blocks a CTA, cfg.blocks_per_cta).

    Row ``gi * TB + tl`` of row block ``m = n * P + w`` holds new_mask[b, m*TB + tl]
    (every head gi of a token sees the same keys); rows past T and keys past T are 0. Tn is T
    rounded up to block_k. One XLA fusion of new_mask alone, so a forward's layers share it.
    """
    bt, t, _ = new_mask.shape
    tb, _, ng = _groups(t, g, cfg)
    per = cfg.blocks_per_cta
    rows = ng * per * tb
    tn = pl.cdiv(t, cfg.block_k) * cfg.block_k
    m = jnp.pad(new_mask, ((0, 0), (0, rows - t), (0, tn - t))).astype(dtype)
    m = m.reshape(bt, ng, per, 1, tb, tn)
    m = jnp.broadcast_to(m, (bt, ng, per, g, tb, tn))
    return m.reshape(bt, ng * per * BLOCK_M, tn)


def step_flags(mask, cfg: MgpuConfig):
    """int32 [Bt, row blocks, new-key steps]: 1 where a row block's mask tile of that step holds
    a visible key (fold_mask's output in, one XLA reduction)."""
    bt, rows, tn = mask.shape
    m = mask.reshape(bt, rows // BLOCK_M, BLOCK_M, tn // cfg.block_k, cfg.block_k)
    return (m > 0.5).any(axis=(2, 4)).astype(jnp.int32)


def _kernel(len_ref, layer_ref, q_ref, k_ref, v_ref, kn_ref, vn_ref, mask_ref, flags_ref, o_ref, lse_ref,
            q_smem, k_smem, v_smem, m_smem, q_bar, k_bar, v_bar, m_bar, k_free, v_free,
            part_acc, part_ml, part_bar, lse_smem, *, t: int, g: int, scale: float, cfg: MgpuConfig,
            interpret: bool, g0: int = 0):
    """One CTA: (row-block group n and key share c, kv head h, batch row b), warpgroups
    0..compute_wgs-1 compute, warpgroup compute_wgs loads. part_*: split_keys' merge; lse_*:
    key_splits' row log2-sum-exp2 (None otherwise). g0: the first row-block group of this
    launch (tail_splits' second launch): o_ref's and lse_ref's rows start at its first token.
    k_ref, v_ref: every layer's cache, [L * Bt, Hkv, S, Dh]; layer_ref int32[1] picks rows
    layer * Bt .. layer * Bt + Bt - 1 (q, the new keys, the mask and the outputs are one layer's)."""
    bk, stages, nwg = cfg.block_k, cfg.stages, cfg.compute_wgs
    split, per, nsplit = cfg.split_keys, cfg.blocks_per_cta, cfg.key_splits
    seq, dh = k_ref.shape[2], k_ref.shape[3]
    tb = BLOCK_M // g
    n, h, b = lax.axis_index("n"), lax.axis_index("h"), lax.axis_index("b")
    c = 0
    if nsplit > 1:
        n, c = lax.div(n, nsplit), lax.rem(n, nsplit)  # c: this CTA's share of the keys
    n = n + g0
    row_off = g0 * per * tb           # o_ref's first row (token) in this launch
    wg = lax.axis_index("wg")
    cache_len = jnp.clip(len_ref[b], 0, seq)
    n_pre = lax.div(cache_len + (bk - 1), bk)     # prefix steps (the last one may be ragged)
    n_full = lax.div(cache_len, bk)                # prefix steps with every key valid
    n_new = pl.cdiv(t, bk)
    dt = q_ref.dtype
    # Key steps [lo, hi) of the n_pre + n_new: all of them, or share c of key_splits.
    lo, hi = 0, n_pre + n_new
    if nsplit > 1:
        share = lax.div(hi + (nsplit - 1), nsplit)
        lo = jnp.minimum(c * share, hi)
        hi = jnp.minimum(lo + share, hi)

    def slot_of(j):
        return lax.rem(j - lo, jnp.int32(stages))

    # --------------------------------------------------------------------- memory warpgroup
    @pl.when(wg == nwg)
    def _memory():
        if nwg == 2 and not interpret:
            plgpu.set_max_registers(40, action="decrease")

        # This layer's cache rows. The index is clamped (as XLA's dynamic index is) so that no
        # TMA copy can leave the array.
        layers = k_ref.shape[0] // q_ref.shape[0]
        cb = clamp_layer(layer_ref[0], layers) * q_ref.shape[0] + b

        def fetch(j, slot, cache_ref, new_ref, smem, bar, free):
            """Step j's K (or V) tile into its ring slot, once step j - stages has freed it: the
            prefix block j, or new-key block j - n_pre."""
            @pl.when(j - lo >= stages)
            def _():
                plgpu.barrier_wait(free.at[slot])

            @pl.when(j < n_pre)
            def _():
                plgpu.copy_gmem_to_smem(cache_ref.at[cb, h, pl.ds(j * bk, bk)], smem.at[slot], bar.at[slot])

            @pl.when(j >= n_pre)
            def _():
                plgpu.copy_gmem_to_smem(new_ref.at[b, pl.ds((j - n_pre) * bk, bk), h], smem.at[slot],
                                        bar.at[slot])

        def issue(j, carry):
            slot = slot_of(j)
            fetch(j, slot, k_ref, kn_ref, k_smem, k_bar, k_free)

            @pl.when(j >= n_pre)
            def _():  # a new-key step's mask tile (its slot is freed with K's)
                plgpu.copy_gmem_to_smem(
                    mask_ref.at[b, pl.ds(n * (per * BLOCK_M), per * BLOCK_M), pl.ds((j - n_pre) * bk, bk)],
                    m_smem.at[slot], m_bar.at[slot])

            fetch(j, slot, v_ref, vn_ref, v_smem, v_bar, v_free)
            return carry

        with jax.named_scope("loads"):
            lax.fori_loop(lo, hi, issue, None)

        # Wait out the last steps' releases too: a barrier phase nobody waits for is harmless on
        # the GPU, but the interpreter checks that every waiter saw every phase.
        def drain(j, carry):
            plgpu.barrier_wait(k_free.at[slot_of(j)])
            plgpu.barrier_wait(v_free.at[slot_of(j)])
            return carry

        with jax.named_scope("drain"):
            lax.fori_loop(jnp.maximum(hi - stages, lo), hi, drain, None)

    # -------------------------------------------------------------------- compute warpgroups
    @pl.when(wg < nwg)
    def _compute():
        if nwg == 2 and not interpret:
            plgpu.set_max_registers(232, action="increase")
        blk = n if split else n * nwg + wg
        mrow = 0 if split else wg * BLOCK_M      # this warpgroup's rows in a mask tile
        qi = 0 if split else wg                  # split_keys: one q tile, loaded by warpgroup 0
        qs = q_smem.at[qi]

        with jax.named_scope("q"):
            @pl.when(wg == qi)
            def _():
                for gi in range(g):
                    plgpu.copy_gmem_to_smem(q_ref.at[b, pl.ds(blk * tb, tb), h * g + gi],
                                            qs.at[pl.ds(gi * tb, tb)], q_bar.at[qi * g + gi])
            for gi in range(g):
                plgpu.barrier_wait(q_bar.at[qi * g + gi])

        if interpret:
            layout = row_layout = None
            iota = lax.broadcasted_iota
            load = lambda ref: ref[...]                                     # noqa: E731
            cast = lambda x, _layout: x                                     # noqa: E731
        else:
            layout, row_layout = plgpu.Layout.WGMMA, plgpu.Layout.WGMMA.reduce(1)
            iota = functools.partial(plgpu.broadcasted_iota, layout=layout)
            load = lambda ref: plgpu.load(ref, (), layout=layout)          # noqa: E731
            cast = plgpu.layout_cast

        def qk(slot):
            if interpret:
                return lax.dot_general(qs[...], k_smem.at[slot][...], (((1,), (1,)), ((), ())),
                                       preferred_element_type=jnp.float32)

            def body(acc):
                plgpu.wgmma(acc, qs, plgpu.transpose_ref(k_smem.at[slot], (1, 0)))
                return acc[...]
            return pl.run_scoped(body, plgpu.ACC((BLOCK_M, bk), jnp.float32))

        def pv(acc, p, slot):
            if interpret:
                return acc + lax.dot_general(p, v_smem.at[slot][...], (((1,), (0,)), ((), ())),
                                             preferred_element_type=jnp.float32)

            def body(acc_ref):
                plgpu.wgmma(acc_ref, p, v_smem.at[slot])
            return pl.run_state(body)(plgpu.ACC.init(acc))

        def rowb(x, shape):
            return lax.broadcast_in_dim(x, shape, [0])

        qk_scale = scale * _LOG2E

        def step(j, carry, *, ragged: bool, new: bool):
            """Fold key block j (prefix block j, or new-key block j - n_pre) into the carry;
            skip_empty: a new-key block no row of this block sees only passes its slot on."""
            if not (new and cfg.skip_empty):
                return fold(j, carry, ragged=ragged, new=new)

            def passed(carry):
                slot = slot_of(j)
                with jax.named_scope("skip"):
                    plgpu.barrier_wait(k_bar.at[slot])      # every phase is waited, as fold() does
                    plgpu.barrier_wait(m_bar.at[slot])
                    plgpu.barrier_arrive(k_free.at[slot])
                    plgpu.barrier_wait(v_bar.at[slot])
                    plgpu.barrier_arrive(v_free.at[slot])
                return carry

            seen = flags_ref[b, blk, j - n_pre] > 0
            return lax.cond(seen, functools.partial(fold, j, ragged=False, new=True), passed, carry)

        def fold(j, carry, *, ragged: bool, new: bool):
            slot = slot_of(j)
            keep = None
            # The named scopes are the ranges of profile_mgpu's in-kernel traces (profile_dir).
            with jax.named_scope("wait_k"):
                plgpu.barrier_wait(k_bar.at[slot])
                if new:
                    plgpu.barrier_wait(m_bar.at[slot])
                    keep = load(m_smem.at[slot, pl.ds(mrow, BLOCK_M)]) > 0.5
            with jax.named_scope("qk"):
                s = qk(slot)
            plgpu.barrier_arrive(k_free.at[slot])
            p, carry = softmax(s, carry, j, ragged=ragged, keep=keep)
            return finish(j, p, carry, ragged=ragged)

        def softmax(s, carry, j, *, ragged: bool, keep=None):
            """Step j's scores (unscaled, float32) into its probabilities p and the rescaled
            carry (keep: the new-key step's mask tile)."""
            acc, m_i, l_i = carry
            with jax.named_scope("softmax"):
                # The carry's max is in scaled (log2) units; the scale is folded into exp2's
                # argument (s * qk_scale - max: one multiply-add an element, fused where the
                # compiler contracts it, where a scaling pass and a subtraction were two).
                # qk_scale > 0, so max(s) * qk_scale = max(s * qk_scale). A masked score is _NEG
                # unscaled: a row with no key here gets the max _NEG * qk_scale (finite), and its
                # p is zeroed by `keep` below.
                if keep is not None:
                    s = jnp.where(keep, s, _NEG)
                elif ragged:
                    cols = iota(jnp.int32, (BLOCK_M, bk), 1)
                    s = jnp.where(cols < cache_len - j * bk, s, _NEG)
                m_new = jnp.maximum(m_i, s.max(axis=1) * qk_scale)
                alpha = jnp.exp2(m_i - m_new)
                p = jnp.exp2(s * qk_scale - rowb(m_new, s.shape))
                if keep is not None:
                    # A tile may hold no key some row sees: then m_new can be _NEG * qk_scale.
                    p = jnp.where(keep, p, 0.0)
                l_new = alpha * l_i + p.sum(axis=1)
                acc = acc * rowb(alpha, acc.shape)
            return p, (acc, m_new, l_new)

        def finish(j, p, carry, *, ragged: bool):
            """Step j's value product into the carry, once its V tile is in."""
            acc, m_new, l_new = carry
            slot = slot_of(j)
            with jax.named_scope("wait_v"):
                plgpu.barrier_wait(v_bar.at[slot])
                if ragged:
                    # V rows at or past cache_len may hold anything (NaN, inf): 0 * NaN is NaN.
                    vs = v_smem.at[slot]
                    vrows = iota(jnp.int32, (bk, dh), 0)
                    vals = load(vs)
                    vs[...] = jnp.where(vrows < cache_len - j * bk, vals, jnp.zeros_like(vals))
                    plgpu.commit_smem()
            with jax.named_scope("pv"):
                acc = pv(acc, p.astype(dt), slot)
            plgpu.barrier_arrive(v_free.at[slot])
            return acc, m_new, l_new

        def overlapped(first, count, stride, carry):
            """overlap: this warpgroup's full prefix steps first + i * stride (i < count), each
            step's QK product issued before the previous step's softmax (FlashAttention-3's
            intra-warpgroup pipelining). In interpret mode the same order of barriers and tiles
            with plain dots."""
            def run(carry):
                def body(s_ref):
                    def issue(j):      # wait for step j's K tile, start its QK product
                        slot = slot_of(j)
                        with jax.named_scope("wait_k"):
                            plgpu.barrier_wait(k_bar.at[slot])
                        if interpret:
                            return qk(slot)
                        s_ref[...] = cast(jnp.zeros((BLOCK_M, bk), jnp.float32), layout)
                        plgpu.wgmma(s_ref, qs, plgpu.transpose_ref(k_smem.at[slot], (1, 0)))
                        return None

                    def result(j, pending):   # step j's scores; its K tile is free then
                        if interpret:
                            s = pending
                        else:
                            with jax.named_scope("qk"):
                                s = plgpu.wgmma_accumulator_load(s_ref, wait_n=0)
                        plgpu.barrier_arrive(k_free.at[slot_of(j)])
                        return s

                    s0 = result(first, issue(first))

                    def it(i, c):
                        carry, s = c
                        j = first + i * stride
                        pending = issue(j + stride)          # in flight during the softmax
                        p, carry = softmax(s, carry, j, ragged=False)
                        carry = finish(j, p, carry, ragged=False)
                        return carry, result(j + stride, pending)

                    carry_, s = lax.fori_loop(0, count - 1, it, (carry, s0))
                    last = first + (count - 1) * stride
                    p, carry_ = softmax(s, carry_, last, ragged=False)
                    return finish(last, p, carry_, ragged=False)

                if interpret:
                    return body(None)
                return pl.run_scoped(body, plgpu.ACC((BLOCK_M, bk), jnp.float32))

            return lax.cond(count > 0, run, lambda c: c, carry)

        carry = (cast(jnp.zeros((BLOCK_M, dh), jnp.float32), layout),
                 cast(jnp.full((BLOCK_M,), _NEG, jnp.float32), row_layout),
                 cast(jnp.zeros((BLOCK_M,), jnp.float32), row_layout))
        def own_steps(a, z):
            """(first, count, stride): the steps j in [a, z) that are this CTA's (in [lo, hi))
            and, with split_keys, this warpgroup's (j % nwg == wg), as first + i * stride."""
            if nsplit > 1:
                a, z = jnp.maximum(a, lo), jnp.minimum(z, hi)
            if not split:
                return a, jnp.maximum(z - a, 0), 1
            first = a + lax.rem(wg - lax.rem(a, nwg) + nwg, nwg)
            return first, lax.div(jnp.maximum(z - first, 0) + (nwg - 1), nwg), nwg

        def steps(a, z, carry, *, overlap: bool = False, **kind):
            first, count, stride = own_steps(a, z)
            if overlap:
                return overlapped(first, count, stride, carry)
            body = functools.partial(step, **kind)
            return lax.fori_loop(0, count, lambda i, c: body(first + i * stride, c), carry)

        carry = steps(0, n_full, carry, ragged=False, new=False, overlap=cfg.overlap)
        carry = steps(n_full, n_pre, carry, ragged=True, new=False)
        carry = steps(n_pre, n_pre + n_new, carry, ragged=False, new=True)
        acc, m_i, l_i = carry
        if split:
            with jax.named_scope("merge"):
                # Warpgroup 1 hands its (acc, max, sum) over; warpgroup 0 merges and stores.
                @pl.when(wg == 1)
                def _():
                    part_acc[...] = acc
                    part_ml[0] = m_i
                    part_ml[1] = l_i
                    plgpu.barrier_arrive(part_bar.at[0])

                plgpu.barrier_wait(part_bar.at[0])
                m1 = part_ml[0] if interpret else plgpu.load(part_ml.at[0], (), layout=row_layout)
                l1 = part_ml[1] if interpret else plgpu.load(part_ml.at[1], (), layout=row_layout)
                acc1 = load(part_acc)
                m_new = jnp.maximum(m_i, m1)
                a0, a1 = jnp.exp2(m_i - m_new), jnp.exp2(m1 - m_new)
                acc = acc * rowb(a0, acc.shape) + acc1 * rowb(a1, acc.shape)
                l_i, m_i = a0 * l_i + a1 * l1, m_new
        l_safe = jnp.where(l_i > 0.0, l_i, 1.0)       # rows past T may see nothing

        ob = b if nsplit == 1 else c * q_ref.shape[0] + b      # key_splits: share c's partial

        def store():
            qs[...] = (acc * rowb(1.0 / l_safe, acc.shape)).astype(dt)   # 2 divisions a thread, not 64
            if nsplit > 1:   # the rows' log2-sum-exp2 (scaled scores), for the merge
                lse_smem.at[qi][...] = jnp.where(l_i > 0.0, m_i + jnp.log2(l_safe), _NEG)
            plgpu.commit_smem()
            # Stores of 8 rows (T is a multiple of 8), each either inside the array or skipped:
            # no store relies on TMA clipping a box.
            for gi in range(g):
                for r in range(0, tb, 8):
                    row0 = blk * tb + r
                    pl.when(row0 < t)(functools.partial(
                        plgpu.copy_smem_to_gmem, qs.at[pl.ds(gi * tb + r, 8)],
                        o_ref.at[ob, pl.ds(row0 - row_off, 8), h * g + gi]))
            if nsplit > 1:
                plgpu.copy_smem_to_gmem(lse_smem.at[qi],
                                        lse_ref.at[ob, h, pl.ds((blk - g0 * per) * BLOCK_M, BLOCK_M)])
            # Only until the copies have read shared memory (which the CTA's exit frees): the
            # writes to global memory are complete at the kernel's end (CUTLASS's epilogues wait
            # the same way).
            plgpu.wait_smem_to_gmem(0, wait_read_only=True)

        with jax.named_scope("store"):
            if split:
                pl.when(wg == 0)(store)
            else:
                store()


def interpret_params():
    """Mosaic GPU interpret mode's settings for this package's kernels."""
    from jax._src.pallas.mosaic_gpu.interpret.params import InterpretGPUParams
    # TMA zero-fills what lies outside an array; the interpreter does that with these two.
    return InterpretGPUParams(out_of_bounds_reads="uninitialized", uninitialized_memory="zero")


def _kernel_call(q, k_new, v_new, k_cache, v_cache, cache_len, layer, mask, flags, *, scale: float,
                 cfg: MgpuConfig, interpret: bool, profile_dir: str | None = None,
                 groups: tuple[int, int] | None = None):
    """The kernel on checked inputs, the folded mask (fold_mask) and its step flags
    (step_flags; a dummy without skip_empty). k_cache, v_cache: every layer's, stacked
    [L, Bt, Hkv, S, Dh]; layer: int32[1], the one attended to (traced, so that every layer of a
    forward calls this one compiled kernel). profile_dir: Mosaic GPU's in-kernel profiler
    writes a trace of the kernel's named scopes there at every call (bench/profile_mgpu.py).
    groups: (first, count) row-block groups of each (batch row, kv head) this launch takes
    (default: all); its outputs then hold the rows from its first token on (rows of later groups
    are left unwritten)."""
    bt, t, hq, dh = q.shape
    _, _, hkv, seq, _ = k_cache.shape
    g = hq // hkv
    # The layers' batch rows as one axis (a free reshape): the kernel's TMA copies index the
    # cache rows with layer * Bt + b.
    k_cache, v_cache = (c.reshape((-1,) + c.shape[2:]) for c in (k_cache, v_cache))
    dtype = q.dtype
    tb, _, ng = _groups(t, g, cfg)
    g0, ng = groups or (0, ng)
    per = cfg.blocks_per_cta
    t_out = t - g0 * per * tb
    tiled = (plgpu.TilingTransform((8, 64)), plgpu.SwizzleTransform(128))
    nwg, stages, bk = cfg.compute_wgs, cfg.stages, cfg.block_k
    kernel = functools.partial(_kernel, t=t, g=g, scale=float(scale), cfg=cfg,
                               interpret=interpret, g0=g0)

    nsplit = cfg.key_splits
    profiler = {}
    if profile_dir:   # Mosaic GPU's in-kernel profiler, sized to the shapes (profile_ranges)
        profiler = dict(profile_space=profile_ranges(t, seq, cfg), profile_dir=profile_dir)
    out_type = jax.ShapeDtypeStruct((nsplit * bt, t_out, hq, dh), dtype)
    if nsplit > 1:   # the shares' partial outputs and their rows' log2-sum-exp2 (folded order)
        out_type = (out_type, jax.ShapeDtypeStruct((nsplit * bt, hkv, ng * per * BLOCK_M),
                                                   jnp.float32))

    def entry(len_ref, layer_ref, q_ref, k_ref, v_ref, kn_ref, vn_ref, mask_ref, flags_ref, o_ref,
              lse_ref=None):
        pl.run_scoped(
            lambda *scratch: kernel(len_ref, layer_ref, q_ref, k_ref, v_ref, kn_ref, vn_ref, mask_ref,
                                    flags_ref, o_ref, lse_ref, *scratch),
            plgpu.SMEM((cfg.blocks_per_cta, BLOCK_M, dh), dtype, transforms=tiled),
            plgpu.SMEM((stages, bk, dh), dtype, transforms=tiled),
            plgpu.SMEM((stages, bk, dh), dtype, transforms=tiled),
            plgpu.SMEM((stages, cfg.blocks_per_cta * BLOCK_M, bk), dtype, transforms=tiled),
            plgpu.Barrier(num_barriers=cfg.blocks_per_cta * g),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
            plgpu.Barrier(num_barriers=stages),
            # A slot is free once every warpgroup that reads it is done (split_keys: one).
            plgpu.Barrier(num_arrivals=1 if cfg.split_keys else nwg, num_barriers=stages),
            plgpu.Barrier(num_arrivals=1 if cfg.split_keys else nwg, num_barriers=stages),
            plgpu.SMEM((BLOCK_M, dh), jnp.float32, transforms=(
                plgpu.TilingTransform((8, 32)), plgpu.SwizzleTransform(128))) if cfg.split_keys else None,
            plgpu.SMEM((2, BLOCK_M), jnp.float32) if cfg.split_keys else None,
            plgpu.Barrier(num_barriers=1) if cfg.split_keys else None,
            plgpu.SMEM((cfg.blocks_per_cta, BLOCK_M), jnp.float32) if nsplit > 1 else None,
            collective_axes="wg",
        )

    return plgpu.kernel(
        entry,
        out_type=out_type,
        grid=_grid(t, bt, hkv, g, cfg, ng),
        grid_names=("n", "h", "b"),
        num_threads=nwg + 1,
        thread_name="wg",
        compiler_params=plgpu.CompilerParams(
            approx_math=True, **profiler),
        interpret=interpret_params() if interpret else None,
    )(cache_len, layer, q, k_cache, v_cache, k_new, v_new, mask, flags)


# Jitted, so that the layers of a forward call one lowered function: a Mosaic GPU kernel takes
# ~0.4 s to lower (its Python lowering) and ~1 s to compile, and a forward inlining it 36 times
# held 36 copies of it (16 calls lowered in 9.9 s and compiled in 21 s, against 0.5 and 1.0 s
# through one callee; tests/test_kernels_mgpu.py checks the module holds one). The layer is a
# traced argument for the same reason: a static one would lower a kernel per layer.
_kernel_jit = jax.jit(_kernel_call, static_argnames=("scale", "cfg", "interpret", "profile_dir", "groups"))


def profile_ranges(t: int, seq: int, cfg: MgpuConfig) -> int:
    """The profiler's space, in ranges a warpgroup (each 16 bytes of shared memory): a key step
    records at most 5 (wait_k, qk, softmax, wait_v, pv), a warpgroup 3 more (q, merge, store),
    the memory warpgroup 2 (loads, drain). Too little space would corrupt memory."""
    return 5 * (pl.cdiv(seq, cfg.block_k) + pl.cdiv(t, cfg.block_k)) + 8


def attention_mgpu(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, *, scale: float,
                   kv_start=None, config: MgpuConfig | None = None, interpret: bool = False,
                   profile_dir: str | None = None, layer=None):
    """Mosaic GPU path; same contract as :func:`ddtree_jax.kernels.attention` (no kv_start).
    profile_dir (GPU only): trace the kernel's named scopes there (bench/profile_mgpu.py).

    layer None: k_cache and v_cache are one layer's [Bt, Hkv, S, Dh]. Else they are every
    layer's, stacked [L, Bt, Hkv, S, Dh], and `layer` (a Python int or an int32 scalar, possibly
    traced) is the one attended to: the kernel reads it at run time, so every layer of a forward
    calls one compiled kernel, and only that layer's K / V tiles are read (no slice is copied).
    A traced layer outside [0, L) is clamped into it, as XLA's dynamic index is.

    The mask is folded out here, outside the jitted kernel call, so that a forward's layers,
    which all pass the same new_mask, share one folding fusion (XLA's CSE); inside the callee
    each layer would fold its own copy."""
    check_attention_shapes(q, k_new, v_new, k_cache, v_cache, cache_len, new_mask, kv_start, layer)
    layer, k_cache, v_cache = as_stack(layer, k_cache, v_cache)     # one code path: a stack of one
    one = jax.ShapeDtypeStruct(k_cache.shape[1:], k_cache.dtype)    # a layer's [Bt, Hkv, S, Dh]
    cfg = config or MgpuConfig()
    why = mgpu_unsupported(q, one, kv_start, cfg)
    if why:
        raise ValueError(f"the Mosaic GPU attention kernel cannot take these inputs: {why}; "
                         "use impl='pallas' (Triton) or 'xla'")
    g = q.shape[2] // one.shape[1]
    mask = fold_mask(new_mask, g, cfg, q.dtype)
    flags = step_flags(mask, cfg) if cfg.skip_empty else jnp.zeros((1, 1, 1), jnp.int32)
    call = functools.partial(_kernel_jit, q, k_new, v_new, k_cache, v_cache, cache_len.astype(jnp.int32),
                             layer_index(layer), mask, flags, scale=float(scale), interpret=interpret,
                             profile_dir=None if interpret else profile_dir)

    def run(c: MgpuConfig, groups=None):
        out = wait_if_interpreted(call(cfg=dataclasses.replace(c, merge_kernel=False), groups=groups), interpret)
        if c.key_splits == 1:
            return out
        if c.merge_kernel:
            return split_merge.merge_splits_kernel(*out, splits=c.key_splits, g=g, block_m=BLOCK_M,
                                                   interpret=interpret)
        return merge_splits(*out, splits=c.key_splits, g=g)

    tb, _, ng = _groups(q.shape[1], g, cfg)
    if _head_groups(q.shape[1], g, cfg) == ng:
        return run(dataclasses.replace(cfg, tail_splits=1))
    # The last group's keys split over tail_splits CTAs in a launch of its own; its rows replace
    # the first launch's (which never wrote them). A concatenation (one small XLA fusion, with the
    # split's merge), not an in-place update of the kernel's output: XLA on the H200 rejected
    # that ("DynamicSliceFusion: DUS target must be a fusion parameter").
    t0 = (ng - 1) * cfg.blocks_per_cta * tb
    head = run(dataclasses.replace(cfg, tail_splits=1), (0, ng - 1))
    tail = run(dataclasses.replace(cfg, key_splits=cfg.tail_splits, tail_splits=1), (ng - 1, 1))
    return jnp.concatenate([head[:, :t0], tail], axis=1)


def merge_splits(parts, lse, *, splits: int, g: int):
    """key_splits' merge: parts [N * Bt, T, Hq, Dh], share c's output normalized over its keys at
    rows c * Bt + b; lse float32 [N * Bt, Hkv, rows], each row's log2-sum-exp2 of its scaled
    scores in the kernel's folded row order (row gi * TB + tl of block m: token m * TB + tl, head
    h * G + gi; -1e30 where the share saw no key). Returns [Bt, T, Hq, Dh] in parts' dtype.

    Written share by share (elementwise maxima and sums, no reduce over the N axis): XLA on the
    H200 still emits two fusions (the weights' exponentials, then the weighted sum), but not a
    third small one the reduces made (0.3 us a layer alone at T = 72)."""
    nb, t, hq, dh = parts.shape
    bt, hkv, rows = nb // splits, lse.shape[1], lse.shape[2]
    tb = BLOCK_M // g
    lse = lse.reshape(splits, bt, hkv, rows // BLOCK_M, g, tb)
    lse = lse.transpose(0, 1, 3, 5, 2, 4).reshape(splits, bt, rows // BLOCK_M * tb, hq)[:, :, :t]
    parts = parts.reshape(splits, bt, t, hq, dh)
    top = functools.reduce(jnp.maximum, [lse[c] for c in range(splits)])      # [Bt, T, Hq]
    w = [jnp.exp2(lse[c] - top) for c in range(splits)]
    den = functools.reduce(jnp.add, w)
    o = functools.reduce(jnp.add, [w[c][..., None] * parts[c].astype(jnp.float32) for c in range(splits)])
    return (o / jnp.where(den > 0.0, den, 1.0)[..., None]).astype(parts.dtype)
