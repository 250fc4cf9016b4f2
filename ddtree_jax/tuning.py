"""Per-device tuning: every threshold, tile and compiler option that picks between exact paths.

One frozen (hashable) `Tuning` is chosen once from the device (`tuning_for`) and travels as
static configuration: the engine's `DecodeSpec.tuning`, a tree policy's `tuning`, the models'
`kernels` argument. Changing it recompiles, as any static argument does. Tests build their own
(`dataclasses.replace`) instead of patching globals. Every choice here leaves the output
unchanged: the paths it picks between compute the same values (the tests check each against
its reference).

Its parts: `TreeTuning` (how the tree build runs), `KernelTuning` (which kernel each of the
model's calls runs: ddtree_jax.kernels.dispatch reads it and nothing else; the user's
`--attn-impl` / `--matmul-impl` / `--cache-impl` are folded into it), the round executable's XLA
options and the loop's unroll. Kernel tile tables measured per device kind stay beside their
kernels (`kernels/attention_configs.json`, `kernels/matmul_configs.json`); `KernelTuning.tile_table`
names the device kind they are looked up under.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

NEVER = 2**31 - 1  # a size threshold no tree reaches


@dataclasses.dataclass(frozen=True)
class VocabTopK:
    """The vocabulary top-k of the tree build in two stages (`trees.ddtree.vocab_top_k`): each of
    `chunks` slices keeps its best `keep` (from K >= `keep_from_k`; below, all K) by the threshold
    kernel (`radix_bits` key bits a round, `num_warps` a program), then the top K of the
    candidates: by the threshold kernel and a pairwise order up to K = `stage2_max_k` (where every
    chunk keeps all K), past it by `select_top` where `stage2_select`, else by `lax.top_k`."""

    chunks: int = 128
    keep: int = 64
    keep_from_k: int = 512            # below, chunks keep all K: no lax.cond fallback (on a GPU a host round trip)
    stage2_max_k: int = 64
    stage2_select: bool = True
    radix_bits: int = 2               # 1, 2 or 4
    num_warps: int = 4


KERNEL_MODES = ("pallas", "pallas_interpret")


@dataclasses.dataclass(frozen=True)
class TreeTuning:
    """How the tree build runs (`trees.ddtree`, `trees.base`); the tree is the same every way.

    kernels: "pallas" (compiled Pallas kernels, GPUs) or "pallas_interpret" (the same kernels
    interpreted: the CPU tests). A threshold of 0 turns its kernel off. The default is the CPU's:
    XLA's ops only.
    """

    kernels: str = "pallas_interpret"
    rank_by_count_max: int = 0        # selections up to this many entries rank by pairwise count, else sort
    select_barrier: bool = False      # materialize a selection's inputs (else XLA fuses its gathers into the rank)
    select_onehot_max: int = 0        # pick selected entries by one-hot reductions up to n * P entries
    ancestor_chain_from: int = NEVER  # ancestor mask by parent chasing from this many slots, else squaring
    pair_kernel_from: int = 0         # a depth's selection in pair_select from this many candidates
    pair_kernel_tile: tuple[int, int, int] = (16, 32, 4)  # pair_select's (ti, a, warps)
    runs_kernel_from: int = 0         # the final selection in runs_select from this many entries
    vocab_topk: VocabTopK | None = None  # None: one lax.top_k over the vocabulary

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_MODES:
            raise ValueError(f"TreeTuning.kernels={self.kernels!r}; choose one of {', '.join(KERNEL_MODES)}")


ATTENTION_IMPLS = ("auto", "xla", "pallas", "triton", "pallas_interpret", "mosaic", "mosaic_interpret")
KERNEL_IMPLS = ("auto", "xla", "pallas", "triton", "pallas_interpret")   # norms, products, cache writes
AUTO_CHOICES = ("xla", "pallas")
DETERMINISTIC_IMPLS = ("pallas", "triton", "pallas_interpret")
MOE_EXPERT_IMPLS = ("ragged", "dense", "gather", "grouped")
GDN_TREE_FORMS = ("parallel", "recurrent")


@dataclasses.dataclass(frozen=True)
class KernelTuning:
    """Which kernel each of the model's calls runs (ddtree_jax.kernels.dispatch decides from this
    and the call's shapes); the outputs are the same every way.

    deterministic: every row of a pass computes bit for bit what a one-row step computes for its
    token, whatever the number of rows (dispatch: the products, the attention and the norms
    through Pallas kernels with one fixed config each, no split or tile that follows the row
    count; the MoE experts and the LM head through the same product). attention, norms and
    matmul must then name a kernel impl ("pallas", "triton" or "pallas_interpret"), which says
    only whether the kernels run compiled or interpreted (`as_deterministic`).

    attention, norms, matmul, cache: the user's impl for the attention, the RMSNorm / q-k-norm +
    RoPE kernels, the projections and LM heads, and the commit's cache writes: "auto" (this
    device's choice, `auto_*`), or an explicit impl ("xla", "pallas" = "triton",
    "pallas_interpret"; attention also "mosaic", "mosaic_interpret"). norms None: the one that
    goes with `attention`. The default is the CPU's: XLA everywhere, no tables.
    """

    attention: str = "auto"
    norms: str | None = None
    matmul: str = "auto"
    cache: str = "auto"
    # What "auto" runs here, "pallas" or "xla". The Triton-lowered kernels need NVIDIA compute
    # capability >= 8.0 (Ampere's async copies and bf16 tensor cores); elsewhere XLA.
    auto_attention: str = "xla"
    auto_norms: str = "xla"        # the fused add + norm and q/k-norm + RoPE kernels: launch-bound layers
    # the skinny-matmul kernel, where the tile table measured it faster than XLA's dot (else XLA's)
    auto_matmul: str = "xla"
    auto_cache: str = "xla"        # every layer's commit write in one kernel instead of a scatter an array
    # Longest T "auto" gives the Triton attention kernel: it unrolls its new-key steps, and a
    # prompt-sized T (8192 on the H200) compiled for minutes; the engine prefills in 1024-token pieces.
    max_new_tokens: int = 2048
    # Padded T at which "auto" takes the Mosaic GPU attention kernel by size alone (None: no Mosaic
    # GPU kernel here: wgmma is sm_90a only). From DDTree-255 (T = 256) up it beat Triton in rounds
    # (DDTree-1024's attention 58 against 172 us a layer); smaller T only where a one-wave config fits.
    mosaic_t_range: tuple[int, int] | None = None
    # Cache capacity from which the Mosaic GPU kernel's long-cache configs apply: from 5120 positions
    # a request's prefix averages > 2k, where the tail split and two-wave grids pay.
    mosaic_long_cache_from: int = 5120
    sm_count: int | None = None    # the GPU's SMs: a one-wave Mosaic GPU config must fit them (None: unknown)
    # Device kind under which the measured tile tables are read (None: no entries; default tiles).
    tile_table: str | None = None
    # XLA options of the executable being traced, sorted (name, value) pairs: a matmul table entry
    # measured under options (split-K off) applies only in executables compiled with them.
    xla_options: tuple[tuple[str, Any], ...] = ()
    # How an MoE block's experts run (models.moe.experts; dispatch.moe_choice): "ragged" (grouped
    # lax.ragged_dot), "dense" (every expert over every token, each token's k picked after) or
    # "gather" (each token's k experts' weights gathered) or "grouped" (the rows grouped by expert into
    # the skinny-matmul kernel's row tiles: each touched expert read once a tile; Pallas only); passes
    # of up to moe_gather_max tokens gather.
    moe_experts: str = "dense"  # the plain form, which --tp partitions along the expert axis as it is
    moe_gather_max: int = 0
    # How a hybrid target's verify runs its Gated DeltaNet layers over the tree (models.gdn.tree_verify):
    # "parallel" (the chunked form's algebra with the ancestor mask: XLA's products and solve) or
    # "recurrent" (node by node in depth-first order through the recurrence kernel, as the
    # deterministic mode always does; the commit steps the accepted path again).
    gdn_tree: str = "parallel"
    deterministic: bool = False
    # The one-axis jax.sharding.Mesh the round is sharded over (--tp; ddtree_jax/sharding.py), None
    # on one device: dispatch then runs each Pallas call per shard, inside jax.shard_map.
    mesh: Any = None

    def __post_init__(self) -> None:
        for name, allowed in (("attention", ATTENTION_IMPLS), ("matmul", KERNEL_IMPLS), ("cache", KERNEL_IMPLS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"unknown {name} impl {getattr(self, name)!r}; choose one of {', '.join(allowed)}")
        if self.norms is not None and self.norms not in KERNEL_IMPLS:
            raise ValueError(f"unknown norm impl {self.norms!r}; choose one of {', '.join(KERNEL_IMPLS)}")
        if self.norms is None and self.attention.startswith("mosaic"):
            raise ValueError(f"attention {self.attention!r} has no norm kernels of its own; give norms= as well")
        if self.moe_experts not in MOE_EXPERT_IMPLS:
            raise ValueError(f"KernelTuning.moe_experts={self.moe_experts!r}; "
                             f"choose one of {', '.join(MOE_EXPERT_IMPLS)}")
        if self.gdn_tree not in GDN_TREE_FORMS:
            raise ValueError(f"KernelTuning.gdn_tree={self.gdn_tree!r}; choose one of {', '.join(GDN_TREE_FORMS)}")
        if self.deterministic:
            bad = [f"{name} {impl!r}" for name, impl in (("attention", self.attention), ("norms", self.norm_impl),
                                                          ("matmul", self.matmul)) if impl not in DETERMINISTIC_IMPLS]
            if bad:
                raise ValueError(f"the deterministic mode runs its own Pallas kernels, not {', '.join(bad)}; "
                                 f"leave the impls at auto or pick one of {', '.join(DETERMINISTIC_IMPLS)}")
        if self.mesh is not None and len(self.mesh.axis_names) != 1:
            raise ValueError(f"KernelTuning.mesh must have one axis, got {self.mesh.axis_names}")
        for name in ("auto_attention", "auto_norms", "auto_matmul", "auto_cache"):
            if getattr(self, name) not in AUTO_CHOICES:
                raise ValueError(f"KernelTuning.{name}={getattr(self, name)!r}; "
                                 f"choose one of {', '.join(AUTO_CHOICES)}")

    @property
    def norm_impl(self) -> str:
        """The norm kernels' impl: `norms`, else the one that goes with `attention` ("triton" is "pallas")."""
        if self.norms is not None:
            return self.norms
        return "pallas" if self.attention == "triton" else self.attention

    @property
    def gdn_recurrent(self) -> bool:
        """Whether a hybrid target's GDN tree verify steps node by node through the recurrence kernel
        (the deterministic mode, gdn_tree "recurrent") rather than running the parallel form."""
        return self.deterministic or self.gdn_tree == "recurrent"

    def with_impls(self, *, attention: str | None = None, norms: str | None = None, matmul: str | None = None,
                   cache: str | None = None) -> "KernelTuning":
        """This tuning with the user's impls (None: keep the current one; in the deterministic mode
        "auto" keeps it too: the mode picks its kernels)."""
        given = dict(attention=attention, norms=norms, matmul=matmul, cache=cache)
        keep = (None, "auto") if self.deterministic else (None,)
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v not in keep})

    def as_deterministic(self, interpret: bool | None = None) -> "KernelTuning":
        """This tuning in the deterministic mode (see the class doc): its kernels compiled, or
        interpreted where `interpret` (None: where this device runs no Triton kernels, the CPU's
        case, slow: the tests)."""
        if interpret is None:
            interpret = self.auto_attention != "pallas"
        impl = "pallas_interpret" if interpret else "pallas"
        return dataclasses.replace(self, deterministic=True, attention=impl, norms=impl, matmul=impl)

    def compiled_with(self, options: dict | None) -> "KernelTuning":
        """This tuning for an executable compiled with these XLA options on top of `xla_options`."""
        if not options:
            return self
        return dataclasses.replace(self, xla_options=tuple(sorted({**dict(self.xla_options), **options}.items())))


CPU_KERNELS = KernelTuning()
# Everything on XLA's ops whatever the device: training differentiates through the model, and the
# Pallas kernels have no VJP.
XLA_KERNELS = KernelTuning(attention="xla", matmul="xla", cache="xla")
# MoE experts on NVIDIA GPUs (Qwen3-30B-A3B's shape, bf16, H100): "grouped" reads only the experts
# a pass touches, where "dense" and XLA's ragged_dot run every expert over every row (DFlash's round
# 11.8 against 22.2 ms, DDTree-64's 19.2 against 24.3) and "gather" copies a token's experts before
# its product (the AR step 6.62 against grouped's 5.61 ms; bench/RESULTS.md).
GPU_KERNELS = KernelTuning(auto_attention="pallas", auto_norms="pallas", auto_matmul="pallas", auto_cache="pallas",
                           moe_experts="grouped")
HOPPER_KERNELS = dataclasses.replace(GPU_KERNELS, mosaic_t_range=(256, 1032))
# Old NVIDIA names without a compute capability to go by: Volta, Turing and earlier.
_PRE_AMPERE = ("tesla", "v100", "p100", "t4", "gtx", "rtx 20", "titan")


def _has(module: str) -> bool:
    """Whether this jax has that Pallas lowering (the Triton one is deprecated from jax 0.11)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def kernel_tuning_for(device) -> KernelTuning:
    """The kernel tuning of `device` (a jax Device, or anything with its device_kind, platform and
    optionally compute_capability and core_count): on Hopper (compute capability 9.0, with Mosaic
    GPU) the Mosaic GPU ranges; on other NVIDIA GPUs of compute capability >= 8.0 (by kind where
    the capability is unknown) the Triton kernels; on other GPUs XLA; a GPU's kind keys the tile
    tables and its SMs the one-wave configs. Everything else: the CPU's."""
    if device.platform not in ("gpu", "cuda"):
        return CPU_KERNELS
    return dataclasses.replace(_gpu_kernels(device), tile_table=device.device_kind,
                               sm_count=getattr(device, "core_count", None))


def _gpu_kernels(device) -> KernelTuning:
    if not _has("jax.experimental.pallas.triton"):
        return CPU_KERNELS
    cc = getattr(device, "compute_capability", None)
    if cc is None:
        kind = device.device_kind.lower()
        return CPU_KERNELS if "nvidia" not in kind or any(o in kind for o in _PRE_AMPERE) else GPU_KERNELS
    try:
        major = int(str(cc).split(".")[0])
    except ValueError:
        return CPU_KERNELS
    if major < 8:
        return CPU_KERNELS
    return HOPPER_KERNELS if str(cc) == "9.0" and _has("jax.experimental.pallas.mosaic_gpu") else GPU_KERNELS


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Everything device-specific about how a generation runs (not what it computes)."""

    tree: TreeTuning = TreeTuning()
    kernels: KernelTuning = CPU_KERNELS
    # XLA options of the round executable by the verify pass's row count (nodes + root):
    # ((lo, hi, ((option, value), ...)), ...), the first range holding the row count wins.
    round_xla_options: tuple[tuple[int, int, tuple[tuple[str, Any], ...]], ...] = ()
    unroll: int = 1                   # rounds per iteration of the on-device loop
    # The drafter's kernels where they differ from the target's (None: `kernels`): the drafter only
    # shapes the tree, so the deterministic mode leaves it on the device's fastest kernels.
    drafter_kernels: KernelTuning | None = None

    def as_deterministic(self, interpret: bool | None = None) -> "Tuning":
        """This tuning with the target's kernels in the deterministic mode (KernelTuning.as_deterministic)."""
        return dataclasses.replace(self, kernels=self.kernels.as_deterministic(interpret),
                                   drafter_kernels=self.drafter_kernels or self.kernels)

    @property
    def drafter(self) -> KernelTuning:
        """The kernels the drafter runs."""
        return self.drafter_kernels or self.kernels

    def xla_options(self, rows: int) -> dict:
        """The round executable's XLA options for a verify pass of `rows` rows ({}: none)."""
        for lo, hi, options in self.round_xla_options:
            if lo <= rows <= hi:
                return dict(options)
        return {}


CPU = Tuning()

GPU_TREE = TreeTuning(
    kernels="pallas",
    rank_by_count_max=8192,   # pairwise rank, not XLA's sort, up to B = 1024's candidates (build 1.77 -> 0.99 ms)
    select_barrier=True,      # unmaterialized, XLA fuses each depth's gathers into its rank (0.344 -> 0.317 ms)
    select_onehot_max=20000,  # B <= 64, whose depths are launch-bound (build 0.295 -> 0.266 ms at B = 64)
    ancestor_chain_from=65,   # from B = 64 the squaring's GEMMs cost more than parent chasing
    pair_kernel_from=100,     # B >= ~40: 7.2 us a depth at B = 1024 against XLA's gathers and 12.5 us rank
    runs_kernel_from=1000,    # B >= 256: 5.5 us at B = 1024 against a 44 us pairwise rank
    vocab_topk=VocabTopK(),   # one lax.top_k over 151936 tokens sorts: 0.59 ms, ~0.1 in two stages
)

GPU = Tuning(tree=GPU_TREE, kernels=GPU_KERNELS)

# On the H200 XLA's autotuner splits the o and down products of a 33-65-row verify 8 ways with a
# reduce kernel each; forcing no split made DDTree-64 rounds 6 % faster (and AR, DFlash slower).
H200_XLA_OPTIONS = ((33, 65, (("xla_gpu_experimental_force_split_k", 1),)),)

# The Hopper parts as jax reports them (132 SMs each).
H100 = Tuning(tree=GPU_TREE, kernels=dataclasses.replace(HOPPER_KERNELS, tile_table="NVIDIA H100 80GB HBM3",
                                                         sm_count=132))
H200 = Tuning(tree=GPU_TREE, kernels=dataclasses.replace(HOPPER_KERNELS, tile_table="NVIDIA H200", sm_count=132),
              round_xla_options=H200_XLA_OPTIONS)

BY_DEVICE_KIND = {"NVIDIA H200": dict(round_xla_options=H200_XLA_OPTIONS)}


def tuning_for(device=None, *, deterministic: bool = False) -> Tuning:
    """The tuning of `device` (default: JAX's first device): the tree build by its platform, the
    kernels by its kind, platform and compute capability (`kernel_tuning_for`), the round's XLA
    options by its kind. deterministic: the kernels in the deterministic mode
    (KernelTuning.as_deterministic: interpreted where the device runs no Triton kernels)."""
    import jax

    device = device or jax.devices()[0]
    gpu = device.platform in ("gpu", "cuda")
    tuning = Tuning(tree=GPU_TREE if gpu else TreeTuning(), kernels=kernel_tuning_for(device),
                    **BY_DEVICE_KIND.get(device.device_kind, {}) if gpu else {})
    return tuning.as_deterministic() if deterministic else tuning
