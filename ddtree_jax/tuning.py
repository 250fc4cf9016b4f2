"""Per-device tuning: every threshold, tile and compiler option that picks between exact paths.

One frozen (hashable) `Tuning` is chosen once from the device (`tuning_for`) and travels as
static configuration: the engine's `DecodeSpec.tuning`, a tree policy's `tuning`. Changing it
recompiles, as any static argument does. Tests build their own instead of patching globals.
Every choice here leaves the output unchanged: the paths it picks between compute the same
values (the tests check each against its reference).

Kernel tile tables measured per device kind live beside their kernels
(`kernels/attention_configs.json`, `kernels/matmul_configs.json`).
"""
from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Everything device-specific about how a generation runs (not what it computes)."""

    tree: TreeTuning = TreeTuning()
    # XLA options of the round executable by the verify pass's row count (nodes + root):
    # ((lo, hi, ((option, value), ...)), ...), the first range holding the row count wins.
    round_xla_options: tuple[tuple[int, int, tuple[tuple[str, Any], ...]], ...] = ()
    unroll: int = 1                   # rounds per iteration of the on-device loop

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

GPU = Tuning(tree=GPU_TREE)

# On the H200 XLA's autotuner splits the o and down products of a 33-65-row verify 8 ways with a
# reduce kernel each; forcing no split made DDTree-64 rounds 6 % faster (and AR, DFlash slower).
H200 = dataclasses.replace(GPU, round_xla_options=((33, 65, (("xla_gpu_experimental_force_split_k", 1),)),))

BY_DEVICE_KIND = {"NVIDIA H200": H200}
BY_PLATFORM = {"gpu": GPU, "cuda": GPU}


def tuning_for(device=None) -> Tuning:
    """The tuning of `device` (default: JAX's first device): its kind's, else its platform's."""
    import jax

    device = device or jax.devices()[0]
    return BY_DEVICE_KIND.get(device.device_kind) or BY_PLATFORM.get(device.platform, CPU)
