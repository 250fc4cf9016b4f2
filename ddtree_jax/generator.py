"""The Python API: a `Generator` holds the weights on the device, the compiled executables and
the last request's buffers, and generates for batches of tokenised prompts.

The device work (prefill, then rounds in a while_loop) is compiled ahead of time per shape bucket
and timed without compilation; streaming runs a few rounds per call and prints between calls.
"""
from __future__ import annotations

import dataclasses
import hashlib
import functools
import math
import os
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import compile_cache, engine
from ddtree_jax.cost import CostModel, ModelSignature, auto_lines, resolve_cost_model
from ddtree_jax.profile import profiled_rounds
from ddtree_jax.errors import UserError
from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.models.family import family_of
from ddtree_jax.models.layers import stacks_norms_for
from ddtree_jax.sampling import SamplingConfig
from ddtree_jax import sharding
from ddtree_jax.token_map import check_token_map
from ddtree_jax.tuning import Tuning, tuning_for
from ddtree_jax.kernels import dispatch

METHODS = ("ar", "dflash", "ddtree")
# The tree sizes `--budget auto` chooses among, where its cost model covers them. Each round builds
# the largest: up to 256 that cost ~3.5 % of every batch-1 round at the 8B shape (H100) for sizes
# above 64 that the shipped pair's replay picks in 3 % of its rounds (bench/RESULTS.md).
AUTO_BUDGETS = (16, 32, 64)
AUTO_FALLBACK = 64  # the fixed budget of `--budget auto` without a cost model for the device, model and batch


def prng_key(seed: int) -> jax.Array:
    """The PRNG key of an integer seed of any size. Seeds in [0, 2**64) map one to one onto the
    key's two 32-bit words (below 2**31 that is `jax.random.PRNGKey(seed)`); others hash to them."""
    seed = int(seed)
    if not 0 <= seed < 2**64:
        seed = int.from_bytes(hashlib.sha256(str(seed).encode()).digest()[:8], "big")
    return jnp.asarray(np.asarray([seed >> 32, seed & 0xFFFFFFFF], np.uint32))  # a raw threefry key


def check_budget_fits(budget: int, context: int) -> None:
    """A tree of `budget` nodes and its root must fit the model's context (before anything is traced)."""
    if budget + 2 > context:
        raise UserError(f"--budget {budget} does not fit the model's context of {context} tokens (a round needs "
                        f"budget + 2 cache slots beyond the prompt); lower --budget")


def check_deterministic(attn_impl: str, matmul_impl: str, tp) -> None:
    """UserError unless --deterministic may run with these flags: it runs its own kernels, which
    GSPMD cannot partition."""
    chosen = [f for f, v in (("--attn-impl", attn_impl), ("--matmul-impl", matmul_impl)) if v != "auto"]
    if chosen:
        raise UserError(f"--deterministic runs its own kernels; drop {' and '.join(chosen)}")
    if tp != 1:
        raise UserError("--deterministic runs its products in the skinny-matmul kernel, which does not run per "
                        "shard; use --tp 1")


def device_memory_limit(device) -> int | None:
    """Bytes of memory one device holds: DDTREE_MEMORY_LIMIT_BYTES where set (a cap for shared
    devices, and the tests), else what the device reports (None: unknown, as on the CPU)."""
    if os.environ.get("DDTREE_MEMORY_LIMIT_BYTES"):
        try:
            return int(os.environ["DDTREE_MEMORY_LIMIT_BYTES"])
        except ValueError:
            raise UserError("DDTREE_MEMORY_LIMIT_BYTES must be a whole number of bytes (got "
                            f"{os.environ['DDTREE_MEMORY_LIMIT_BYTES']!r})") from None
    return (device.memory_stats() or {}).get("bytes_limit")


def tree_nbytes(tree) -> int:
    """Bytes held by a pytree's arrays (or ShapeDtypeStructs)."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(tree))


def streamed_to_device(params: dict) -> dict:
    """A param tree (names.py's layout) for fuse_params, the weights reaching the device one
    tensor at a time: the top-level tensors now, each layer's as fuse_params takes the layer
    (an iterator), so fusing a layer frees its pieces before the next arrives and the device
    never holds the weights twice. A LazyTensor (checkpoint.tensors) is read here, while the
    tensor before it is still being copied; that copy is waited for before the next starts, so
    the host holds at most two tensors."""
    in_flight: list[jax.Array] = []

    def put(x):
        if isinstance(x, jax.Array):
            return x
        host = np.asarray(x)
        if in_flight:
            in_flight.pop().block_until_ready()
        out = jax.device_put(host)
        in_flight.append(out)
        return out

    def put_tree(tree):
        return jax.tree_util.tree_map(put, tree)

    top = {k: put_tree(v) for k, v in params.items() if k != "layers"}
    return {**top, "layers": ({k: put_tree(v) for k, v in layer.items()} for layer in params["layers"])}


def _same_shapes(a, b) -> bool:
    """Whether two pytrees of arrays / ShapeDtypeStructs have one structure, shapes and dtypes."""
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    return ta == tb and all(x.shape == y.shape and x.dtype == y.dtype for x, y in zip(la, lb))


def _bucket(n: int, minimum: int = 16) -> int:
    return max(minimum, 1 << max(0, math.ceil(math.log2(max(n, 1)))))


def cache_positions(prompt_len: int, max_new_tokens: int, nodes: int, depth: int) -> tuple[int, int]:
    """(cache positions, output slots) of a request: the prompt and the output each bucketed to a
    power of two, room for two rounds' tree slots (nodes, or the drafter's depth where larger)
    and their roots, rounded up to 128. The kernels' static choices (split counts, the Mosaic
    GPU kernel's long-cache configs) go by the positions, not by the prefix."""
    out_size = _bucket(max_new_tokens)
    need = _bucket(prompt_len) + out_size + 2 * (max(nodes, depth) + 2)
    return -(-need // 128) * 128, out_size


# Streaming doubles the rounds per device call up to this many (the traced limit: no recompile):
# a call costs ~4-6 ms beyond its rounds on the H200, so 4 rounds a call made streamed AR ~23 % slower.
STREAM_MAX_ROUNDS_PER_CALL = 32


class Executables(dict):
    """Compiled executables by key (every static argument and input shape in it), shareable between
    Generators of one checkpoint (`Generator(executables=...)`): configs whose prefill is the same
    compile it once. Threads that ask for one key at a time compile it once."""

    def __init__(self):
        super().__init__()
        self._guard = threading.Lock()
        self._locks: dict = {}

    def lock(self, key) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(key, threading.Lock())


@dataclasses.dataclass
class Result:
    token_ids: list[int]
    num_output_tokens: int
    time_s: float
    tokens_per_s: float
    rounds: int
    acceptance_lengths: list[int]
    mean_acceptance: float
    prefill_s: float
    prompt_tokens: int = 0
    stage_ms: dict[str, float] | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


DRAFTER_QUANTS = ("none", "int8")

class Generator:
    """A loaded target (+ drafter) ready to generate with one method.

    method: "ar" (budget 0), "dflash" (chain of the drafter's top-1 tokens), or "ddtree"
    (a tree of `budget` nodes chosen by `policy`).

    It keeps the device state of its last request (KV caches included) and prefills the next
    request of the same shapes into those buffers (`engine.prefill_into`), which spares the GPU
    an update of the rounds' CUDA graphs each request; `release_buffers()` frees them.
    """

    def __init__(self, ckpt, *, method: str = "ddtree", policy: str = "ddtree", budget: int | str = 64,
                 attn_impl: str = "auto", oracle: dict | None = None, unroll: int = 0,
                 compiler_options: dict | None = None, log: Callable[[str], None] | None = None,
                 executables: Executables | None = None, prefill_chunk: int = 0,
                 matmul_impl: str = "auto", cache_impl: str = "auto", drafter_quant: str = "none",
                 draft_vocab: Sequence[int] | None = None, tuning: Tuning | None = None,
                 cost_model: str | Path | CostModel | None = None, auto_budgets: Sequence[int] = AUTO_BUDGETS,
                 tp: int | str = 1, deterministic: bool = False):
        """oracle: params of the synthetic drafter of drafters/oracle.py, used instead of the
        checkpoint's drafter (tests, benchmarks); its depth is the checkpoint drafter's.
        unroll: rounds per device-loop iteration (engine.DecodeSpec.unroll); 0 picks the
        tuning's. compiler_options: XLA debug options for the prefill and round
        executables (e.g. {"xla_gpu_enable_command_buffer": ""}). log: called with a status line before and
        after each compilation (they take seconds to minutes on large models). executables: an
        `Executables` shared with other Generators of the same checkpoint (the bench suite), so
        that what they have in common compiles once. prefill_chunk: longest prompt piece one
        target forward takes (engine.DecodeSpec.prefill_chunk); 0 picks the engine's default.
        attn_impl, matmul_impl, cache_impl: the attention's, the projections' and the commit's
        cache writes' impl ("auto": the device's choice per call), folded into the tuning's
        kernels (tuning.KernelTuning.with_impls). drafter_quant: "none", or "int8"
        (the drafter's weight matrices and its own copy of the LM head as int8 with per-column
        scales, drafters.dflash.quantize_params: half the bytes a draft reads; lossless, since the
        target verifies every token, but acceptance may change a little). draft_vocab: a token map
        (token_map.read_token_map): the drafter drafts over those ids only, through its own copy
        of the LM head cut to them (drafters.dflash.restrict_vocab; lossless, acceptance may drop a
        little). tuning: how kernels and the tree build run (default: `tuning.tuning_for` the
        first device).
        tp: devices of this host the model is sharded over (ddtree_jax.sharding: weights by heads,
        MLP width and experts, caches by kv heads), or "auto": the fewest whose memory holds the
        weights; above 1 the attention and norm kernels run per shard (shard_map), the products and
        cache writes on XLA's ops.
        deterministic: every verify row computes bit for bit what a one-row step computes for its
        token (tuning.KernelTuning.as_deterministic: fixed tiles, no row-count-dependent split), so
        greedy output is the same under every method and budget in bf16 too; the target's Pallas
        kernels run everywhere, interpreted on the CPU (slow; float32 is exact there without it);
        the drafter keeps the device's own kernels (it only shapes the tree).
        budget="auto" (method ddtree): each round verifies the candidate among `auto_budgets` (the
        policy's tree cut to its best n nodes) and DFlash's chain with the most expected tokens a
        millisecond (engine.auto_stage), by `cost_model` (a CostModel, or a file of one; default: the
        one shipped for this device kind and model shape, see ddtree_jax/cost.py). Where none covers
        a request's batch, the request runs at budget AUTO_FALLBACK, with a warning."""
        from ddtree_jax.trees import make_policy

        if method not in METHODS:
            raise UserError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        self.log = log
        self.auto = budget == "auto"
        self.cost_model: CostModel | None = None
        if self.auto:
            if method != "ddtree":
                raise UserError(f"--budget auto sizes DDTree's tree; it has no effect with --method {method}")
            if not auto_budgets or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in auto_budgets):
                raise UserError(f"auto_budgets must be budgets >= 1 (got {list(auto_budgets)})")
            self.auto_budgets = tuple(sorted(set(auto_budgets)))
            budget = max(self.auto_budgets)
            self._uncovered: set[int] = set()  # batch sizes already warned about
        elif isinstance(budget, bool) or not isinstance(budget, int):
            raise UserError(f"--budget must be a number of draft nodes or auto (got {budget!r})")
        if budget < 0:
            raise UserError(f"--budget must be >= 0 (got {budget})")
        self.ckpt = ckpt
        self.tuning = tuning or tuning_for()
        self.tcfg = ckpt.target_cfg
        self.dcfg = ckpt.drafter_cfg
        if method != "ar" and self.dcfg is None:
            raise UserError(f"method {method} needs a drafter, and this checkpoint has none; "
                            "convert one with python -m convert --draft, or use --method ar")
        if method == "ar":
            policy, budget = "chain", 0
        elif method == "dflash":
            policy, budget = "chain", self.dcfg.depth
        elif budget == 0:
            raise UserError("--method ddtree needs --budget >= 1 (budget 0 is --method ar)")
        check_budget_fits(budget, self.tcfg.max_position)
        if draft_vocab is not None:
            if method == "ar" or oracle is not None:
                raise UserError("--draft-vocab needs a DFlash drafter (method dflash or ddtree)")
            draft_vocab = [int(t) for t in draft_vocab]
            check_token_map(draft_vocab, self.tcfg.vocab_size)
        draft_v = self.tcfg.vocab_size if draft_vocab is None else len(draft_vocab)
        try:
            self.policy = make_policy(policy).with_tuning(self.tuning.tree)
            if budget:  # a policy that cannot build for this drafter fails here, not mid-trace
                logp = jax.ShapeDtypeStruct((1, self.dcfg.depth, draft_v), jnp.float32)
                jax.eval_shape(lambda x: self.policy.build(x, budget), logp)
        except ValueError as e:
            raise UserError(f"tree policy {policy!r}: {e}") from None
        impls = dispatch.available_impls(self.tuning.kernels)
        if attn_impl not in impls:
            raise UserError(f"unknown --attn-impl {attn_impl!r}; available here: {', '.join(impls)}")
        self.method, self.policy_name, self.budget = method, policy, budget
        mm_impls = tuple(x for x in impls if x != "triton")
        if matmul_impl not in mm_impls:
            raise UserError(f"unknown --matmul-impl {matmul_impl!r}; available here: {', '.join(mm_impls)}")
        if cache_impl not in mm_impls:
            raise UserError(f"unknown --cache-impl {cache_impl!r}; available here: {', '.join(mm_impls)}")
        # "auto" leaves the tuning's own choice (a given tuning may carry explicit impls)
        given = dict(attention=attn_impl, matmul=matmul_impl, cache=cache_impl)
        self.deterministic = bool(deterministic)
        if self.deterministic:
            check_deterministic(attn_impl, matmul_impl, tp)
            self.tuning = self.tuning.as_deterministic()
            given = dict(cache=cache_impl)
        chosen = {k: v for k, v in given.items() if v != "auto"}
        kernels = self.tuning.kernels.with_impls(**chosen)
        drafter = self.tuning.drafter_kernels
        self.tuning = dataclasses.replace(self.tuning, kernels=kernels,
                                          drafter_kernels=drafter and drafter.with_impls(**chosen))
        self.attn_impl, self.matmul_impl, self.cache_impl = kernels.attention, kernels.matmul, kernels.cache
        # -- tensor parallelism (ddtree_jax/sharding.py): checked before any weight is read
        self.mesh = self._tp_mesh(tp, ckpt, given, oracle is None and method != "ar")
        # --
        if drafter_quant not in DRAFTER_QUANTS:
            raise UserError(f"unknown --drafter-quant {drafter_quant!r}; choose one of {', '.join(DRAFTER_QUANTS)}")
        if drafter_quant != "none" and (method == "ar" or oracle is not None):
            raise UserError(f"--drafter-quant {drafter_quant} needs a DFlash drafter (method dflash or ddtree)")
        self.drafter_quant = drafter_quant
        if unroll < 0:
            raise UserError(f"unroll must be >= 0 (got {unroll}); 0 picks the device's default")
        self.unroll = unroll or self.tuning.unroll
        if prefill_chunk < 0:
            raise UserError(f"prefill_chunk must be >= 0 (got {prefill_chunk}); 0 picks the default "
                            f"({engine.DecodeSpec.prefill_chunk})")
        self.prefill_chunk = prefill_chunk or engine.DecodeSpec.prefill_chunk
        self.compiler_options = dict(compiler_options) if compiler_options else None
        stack = stacks_norms_for(self.tuning.kernels)
        if self.mesh is not None:
            self.tparams = sharding.put_target(ckpt.target_params, self.mesh, stack=stack,
                                               gdn=getattr(self.tcfg, "gdn", None))
        else:
            self.tparams = family_of(self.tcfg).fuse_params(streamed_to_device(ckpt.target_params), stack=stack)
        self.drafter = "oracle" if oracle is not None else "dflash"
        self.dparams = None
        if method != "ar":
            if self.mesh is not None:
                self.dparams = (sharding.put_replicated(oracle, self.mesh) if oracle is not None
                                else sharding.put_drafter(ckpt.drafter_params, self.mesh, stack=stack))
            else:
                self.dparams = (jax.device_put(oracle) if oracle is not None
                                else dmodel.fuse_params(streamed_to_device(ckpt.drafter_params), stack=stack))
            head = self.tparams["embed"].T if "lm_head" not in self.tparams else self.tparams["lm_head"]
            if draft_vocab is not None:  # on the device, once
                restrict = functools.partial(dmodel.restrict_vocab, quantize=drafter_quant == "int8")
                self.dparams = jax.jit(restrict)(self.dparams, head, jnp.asarray(draft_vocab, jnp.int32))
            elif drafter_quant == "int8":
                self.dparams = jax.jit(dmodel.quantize_params)(self.dparams, head)
            if self.mesh is not None and oracle is None:
                self.dparams = sharding.with_replicated_head(self.dparams, head, self.mesh)
        self._compiled = Executables() if executables is None else executables
        self.compile_s = 0.0  # seconds this Generator spent compiling (the cold start's share)
        self._state_shapes: dict = {}  # request shapes -> the state's shapes (the rounds' input)
        # the last request's final state: the next request of the same shapes prefills into its
        # buffers (`_state_buffers`); `release_buffers()` drops it
        self._kept: engine.State | None = None
        self._kept_lock = threading.Lock()
        self._limits: dict[int, jax.Array] = {}  # rounds_limit's device scalars
        if self.auto:
            self.cost_model = self._auto_cost_model(cost_model, ckpt)
        self._stage_warm: dict = {}

    def _tp_mesh(self, tp: int | str, ckpt, given: dict, with_drafter: bool):
        """The mesh of `tp` devices (None for one), after the checks that need no weight read: the
        devices there are, the model's divisibility, the weights' share of a device's memory. Above
        one device the attention and norm kernels run per shard (shard_map), the products, cache
        writes and tree build on XLA's ops: GSPMD cannot partition a Pallas call."""
        if isinstance(tp, bool) or not isinstance(tp, (int, str)):
            raise UserError(f"--tp must be a number of devices or auto (got {tp!r})")
        tp = sharding.parse_tp(tp)
        dcfg = self.dcfg if with_drafter else None
        params = (ckpt.target_params, ckpt.drafter_params if with_drafter else None)
        devices = jax.devices()
        limit = device_memory_limit(devices[0])
        itemsize = np.dtype(ckpt.target_params["embed"].dtype).itemsize
        head = lambda n: sharding.draft_head_bytes(self.tcfg, with_drafter, itemsize, n)  # noqa: E731
        if tp == "auto":
            weights_at = lambda n: sum(sharding.weight_bytes_per_device(p, n) for p in params) + head(n)  # noqa: E731
            tp = sharding.auto_tp(self.tcfg, dcfg, weights_at, itemsize, limit, len(devices))
        sharding.check_tp(tp, self.tcfg, dcfg, len(devices))
        sharding.check_weights_fit(params, tp, limit, devices[0].device_kind, extra=head(tp))
        self.tp = tp
        if tp == 1:
            return None
        sharding.check_tp_impls(tp, given)
        if getattr(self.tcfg, "gdn", None) is not None:   # a block of Gated DeltaNet heads a device
            self.tcfg = dataclasses.replace(self.tcfg, gdn=dataclasses.replace(self.tcfg.gdn, qkv_groups=tp))
        mesh = sharding.make_mesh(tp, devices)
        self.tuning = sharding.sharded_tuning(self.tuning, mesh)
        self.matmul_impl, self.cache_impl = self.tuning.kernels.matmul, self.tuning.kernels.cache
        return mesh

    def _warn(self, message: str) -> None:
        if self.log is not None:
            self.log(f"warning: {message}")
        else:
            warnings.warn(message, stacklevel=3)

    def _auto_cost_model(self, given, ckpt) -> CostModel | None:
        """`--budget auto`'s cost model: the one given (a file must be for this device kind and
        model shape, else ConfigError), or the shipped one, or None with a warning."""
        if isinstance(given, CostModel):
            return given
        signature = ModelSignature.of(self.tcfg, self.dcfg, ckpt.target_params["embed"].dtype)
        cm, warning = resolve_cost_model(given, jax.devices()[0].device_kind, signature)
        if cm is None:
            self._warn(f"--budget auto: {warning}; running at --budget {AUTO_FALLBACK}")
        return cm

    def auto_lines(self, batch: int):
        """`--budget auto`'s candidates and their costs at `batch` rows (cost.CostLines, cheapest
        first), or None where the cost model covers none of them: that request runs at a fixed budget."""
        cm = self.cost_model
        if cm is None:
            return None
        lines = auto_lines(cm, ("dflash", *self.auto_budgets), batch)
        if lines is None and batch not in self._uncovered:
            self._uncovered.add(batch)
            self._warn(f"--budget auto: the cost model covers none of DFlash and budgets "
                       f"{', '.join(map(str, self.auto_budgets))} at batch {batch} ({cm.describe(one_line=True)}); "
                       f"running at --budget {AUTO_FALLBACK}")
        return lines

    def rounds_limit(self, n: int) -> jax.Array:
        """The device scalar a run_rounds call takes as its round limit, made once per value: on
        the H200 making one (jnp.int32(n): a host-to-device copy and a conversion's launch) cost
        ~0.9 ms, a third of a call's fixed cost."""
        limit = self._limits.get(n)
        if limit is None:
            limit = self._limits[n] = jax.block_until_ready(jnp.int32(n))
        return limit

    @property
    def draft_vocab_size(self) -> int | None:
        """The size of the token map the drafter drafts over (None: the whole vocabulary)."""
        vocab = engine.draft_vocab(self.dparams)
        return None if vocab is None else int(vocab.shape[0])

    # ------------------------------------------------------------------ sizes and checks

    def spec_for(self, prompt_len: int, max_new_tokens: int, sampling: SamplingConfig,
                 min_cache: int = 0, batch: int = 1) -> engine.DecodeSpec:
        budget, auto = self.budget, None
        if self.auto:
            auto = self.auto_lines(batch)
            budget = AUTO_FALLBACK if auto is None else max([c for c in auto.candidates if c != "dflash"],
                                                            default=self.dcfg.depth)
        base = engine.DecodeSpec(budget=budget, policy=self.policy_name, sampling=sampling,
                                 drafter=self.drafter, unroll=self.unroll, tuning=self.tuning,
                                 prefill_chunk=self.prefill_chunk, auto=auto)
        depth = self.dcfg.depth if self.budget else 0
        cache, out_size = cache_positions(prompt_len, max_new_tokens, engine.num_nodes(base, self.dcfg), depth)
        return dataclasses.replace(base, cache_size=max(cache, -(-min_cache // 128) * 128), out_size=out_size)

    def check_request(self, prompt_lens: Sequence[int], max_new_tokens: int, temperature: float, top_p: float):
        if any(n == 0 for n in prompt_lens):
            raise UserError("a prompt is empty; give at least one token of text")
        if max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be >= 1 (got {max_new_tokens})")
        if temperature < 0 or not math.isfinite(temperature):
            raise UserError(f"--temperature must be >= 0 (got {temperature}); 0 means greedy")
        if not 0 < top_p <= 1:
            raise UserError(f"--top-p must be in (0, 1] (got {top_p})")
        longest = max(prompt_lens)
        ctx = self.tcfg.max_position
        slack = self._slack()
        if longest + max_new_tokens > ctx:
            raise UserError(f"the prompt ({longest} tokens) plus --max-new-tokens ({max_new_tokens}) exceeds the "
                            f"model's context of {ctx} tokens; shorten the prompt or lower --max-new-tokens")
        if longest + max_new_tokens + slack > ctx:
            raise UserError(f"--budget {self.budget} needs {slack} cache slots beyond prompt + new tokens, and the "
                            f"model's context is {ctx}; lower --budget or --max-new-tokens")
        self.check_memory(len(prompt_lens), self.spec_for(longest, max_new_tokens, SamplingConfig(),
                                                          batch=len(prompt_lens)))

    def _slack(self) -> int:
        """Cache slots a request needs beyond its prompt and new tokens: a round's tree and block."""
        return self.budget + (self.dcfg.block_size if self.budget else 0) + 1

    def check_memory(self, batch: int, spec: engine.DecodeSpec):
        """Estimate weights + caches before allocating; refuse with the figure when it cannot fit.
        Under --tp N, one device's share (caches by kv heads, logits by vocabulary)."""
        tp = 1 if self.mesh is None else self.tp
        weights = (tree_nbytes if self.mesh is None else sharding.per_device_nbytes)((self.tparams, self.dparams))
        itemsize = jnp.dtype(self.tparams["embed"].dtype).itemsize
        caches = family_of(self.tcfg).cache_bytes(self.tcfg, batch, spec.cache_size, itemsize)
        if self.dcfg is not None and self.budget:
            caches += batch * spec.cache_size * 2 * self.dcfg.num_layers * self.dcfg.num_kv_heads * self.dcfg.head_dim \
                * itemsize
        n = max(1, engine.num_nodes(spec, self.dcfg) + 1)
        logits = batch * n * self.tcfg.vocab_size * 4 * 2
        need = (caches + logits) // tp
        device = jax.devices()[0] if self.mesh is None else self.mesh.devices.flat[0]
        stats = device.memory_stats() or {}
        limit = device_memory_limit(device)
        # the kept state's buffers are reused or released before this request allocates
        in_use = stats.get("bytes_in_use", weights) - (self._kept_bytes() if "bytes_in_use" in stats else 0)
        if limit and need + in_use > limit:
            raise UserError(f"not enough device memory: weights {weights / 2**30:.2f} GiB are loaded and the caches "
                            f"and logits need {need / 2**30:.2f} GiB more, {limit / 2**30:.2f} GiB in all on "
                            f"{device.device_kind}{f' (each of --tp {tp})' if tp > 1 else ''}; lower --max-new-tokens, "
                            f"--budget or the batch{', or raise --tp' if tp < len(jax.devices()) else ''}")

    # ------------------------------------------------------------------ running

    def round_options(self, spec: engine.DecodeSpec) -> dict:
        """XLA options for the round executables of `spec`: the tuning's (engine.round_xla_options),
        overridden by the constructor's compiler_options."""
        return {**engine.round_xla_options(spec, self.dcfg), **(self.compiler_options or {})}

    def _key(self, name, args, static, options):
        return (name, jax.tree_util.tree_structure(args),  # ShapeDtypeStructs and arrays alike
                tuple((x.shape, str(x.dtype)) for x in jax.tree_util.tree_leaves(args)),
                tuple(sorted(static.items())), tuple(sorted((options or {}).items())),
                self.tp)  # an executable is compiled for its inputs' placements: one set per --tp

    def _compile(self, name, fn, args, static, options, key=None):
        """fn compiled for args and static with XLA options `options`."""
        key = key or self._key(name, args, static, options)
        if key in self._compiled:
            return self._compiled[key]
        with self._compiled.lock(key):
            if key not in self._compiled:
                t0 = time.perf_counter()
                spec = static.get("spec")
                # a sharded executable is loaded for its mesh's devices, which the file does not name
                disk = compile_cache.executable_key(key) if self.mesh is None else None
                compiled = compile_cache.load_executable(disk)
                if compiled is not None:
                    if self.log is not None and spec is not None:
                        self.log(f"[ddtree] {name} loaded from the compile cache in {time.perf_counter() - t0:.1f}s")
                else:
                    if self.log is not None and spec is not None:
                        self.log(f"[ddtree] compiling the {name} (cache {spec.cache_size}, output {spec.out_size}) ...")
                    compiled = fn.lower(*args, **static).compile(compiler_options=options)
                    compile_cache.store_executable(disk, compiled)
                    if self.log is not None and spec is not None:
                        self.log(f"[ddtree] {name} compiled in {time.perf_counter() - t0:.1f}s")
                self._compiled[key] = compiled
                self.compile_s += time.perf_counter() - t0
        return self._compiled[key]

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        stop_ids: Sequence[int] = (),
        on_tokens: Callable[[int, list[int]], bool | None] | None = None,
        rounds_per_call: int = 0,
        profile: bool = False,
        min_cache: int = 0,
        start: int | None = None,
    ) -> list[Result]:
        """Generate for a batch of tokenised prompts. on_tokens(row, new_ids) streams tokens; it
        returns True once that row needs no more (a stop string: the caller cuts the text), and
        the calls end when every row is done on the device or so.

        rounds_per_call > 0 streams: the first device call runs that many rounds, each later one
        twice as many as the one before, up to STREAM_MAX_ROUNDS_PER_CALL (first text soon; later,
        fewer calls, as each call has a fixed cost: ~4-6 ms on the H200 for the 8B shape, a round's
        worth); 0 runs to the end in one call. profile=True runs the round's stages as separate
        calls and times each.

        A conversation: min_cache gives its first request caches of at least that many positions;
        a later request with `start` (one prompt, the same min_cache and max_new_tokens) appends
        its prompt at position `start` of the last request's caches, whose first `start`
        positions (the conversation so far: at most its prompt and generated tokens but the last)
        it keeps and attends to.
        """
        self.check_request([len(p) for p in prompts], max_new_tokens, temperature, top_p)
        sampling = SamplingConfig.make(temperature, top_k)
        bt = len(prompts)
        longest = max(len(p) for p in prompts)
        spec = self.spec_for(longest, max_new_tokens, sampling, min_cache, batch=bt)
        if start is not None:
            if bt != 1 or start < 0:
                raise UserError("a conversation continues one prompt at a position >= 0")
            if not family_of(self.tcfg).continues:
                raise UserError(f"a {self.tcfg.family} target cannot continue a conversation in its cache (its "
                                "recurrent state holds the whole text); send the whole conversation as one prompt")
            if start + longest + max_new_tokens + self._slack() > spec.cache_size:
                raise UserError(f"the conversation ({start + longest} tokens) plus --max-new-tokens "
                                f"({max_new_tokens}) no longer fits its cache of {spec.cache_size} positions; "
                                "start a new conversation")
        plen = _bucket(longest)
        prompt = np.zeros((bt, plen), np.int32)
        for i, p in enumerate(prompts):
            prompt[i, : len(p)] = p
        # numpy arrays in one device_put: no conversion launches
        prompt, lens, max_new = jax.device_put((prompt, np.asarray([len(p) for p in prompts], np.int32),
                                                np.full((bt,), max_new_tokens, np.int32)))
        knobs = engine.make_knobs(temperature, top_p, stop_ids)
        static = dict(tcfg=self.tcfg, dcfg=self.dcfg, spec=spec)
        key = prng_key(seed)
        args = (prompt, lens, max_new, knobs, key)
        # the prefill does not depend on the tree: configs that differ there share its executable
        pre_static = dict(static, spec=engine.prefill_spec(spec))
        shapes = self._shapes_of_state(args, pre_static)
        if start is None:
            name, fn = "prefill", engine.prefill_into
            pre_args = (self._state_buffers(shapes), self.tparams, self.dparams, *args)
        else:
            with self._kept_lock:
                kept, self._kept = self._kept, None
            if kept is None or not _same_shapes(kept, shapes):
                raise UserError("no conversation to continue: its last request is gone or had other shapes "
                                "(min_cache and max_new_tokens must stay the same)")
            name, fn = "continued prefill", engine.prefill_continue
            pre_args = (kept, self.tparams, self.dparams, prompt, lens, jax.device_put(np.asarray([start], np.int32)),
                        max_new, knobs, key)
        pre_key = self._key(name, pre_args, pre_static, self.compiler_options)
        prefill = self._compile(name, fn, pre_args, pre_static, self.compiler_options, key=pre_key)
        limit = rounds_per_call if (rounds_per_call and on_tokens) else spec.out_size + 1
        if not profile:  # compile the rounds too before the clock starts, from the state's shapes
            run = self._compile("rounds", engine.run_rounds,
                                (self.tparams, self.dparams, shapes, knobs, self.rounds_limit(limit)),
                                static, self.round_options(spec))

        t0 = time.perf_counter()
        state = prefill(*pre_args)
        if self.mesh is not None:  # the placements the rounds were compiled for (a no-op where they are)
            state = sharding.placed_like(state, shapes)
        jax.block_until_ready(state.root)
        t_prefill = time.perf_counter() - t0
        emitted = [0] * bt
        finished: set[int] = set()  # rows their caller needs no more of
        stage_ms = None
        if on_tokens is not None:
            self._emit(state, emitted, on_tokens, finished)
        if profile:
            first_compiles = not self._stage_warm.get(spec, False)
            self._stage_warm[spec] = True
            emit = None if on_tokens is None else (lambda s: self._emit(s, emitted, on_tokens, finished))
            state, stage_ms = profiled_rounds(self.tparams, self.dparams, state, knobs, tcfg=self.tcfg,
                                                      dcfg=self.dcfg, spec=spec, options=self.round_options(spec),
                                                      first_compiles=first_compiles, on_round=emit)
        else:
            while True:
                state = run(self.tparams, self.dparams, state, knobs, self.rounds_limit(limit))
                if self.mesh is not None:
                    state = sharding.placed_like(state, shapes)
                if on_tokens is not None and self._emit(state, emitted, on_tokens, finished):
                    break
                if np.asarray(state.done).all():  # a copy of Bt flags, no launch
                    break
                limit = max(limit, min(2 * limit, STREAM_MAX_ROUNDS_PER_CALL))
        jax.block_until_ready(state.out)
        elapsed = time.perf_counter() - t0
        out, out_len = np.asarray(state.out), np.asarray(state.out_len)
        rounds, accept = np.asarray(state.rounds), np.asarray(state.accept)
        with self._kept_lock:  # the next request of these shapes prefills into these buffers
            self._kept = state
        results = []
        for i in range(bt):
            acc = accept[i, : rounds[i]].tolist()
            n = int(out_len[i])
            results.append(Result(
                token_ids=out[i, :n].tolist(), num_output_tokens=n, time_s=elapsed,
                tokens_per_s=n / elapsed if elapsed > 0 else float("inf"), rounds=int(rounds[i]),
                acceptance_lengths=acc, mean_acceptance=float(np.mean(acc)) if acc else 0.0,
                prefill_s=t_prefill, prompt_tokens=len(prompts[i]), stage_ms=stage_ms))
        return results

    def _shapes_of_state(self, args, pre_static) -> engine.State:
        """The shapes of the state the prefill makes from `args` (traced once per shape)."""
        key = self._key("state", args, pre_static, None)
        if key not in self._state_shapes:
            shapes = engine.state_shapes(self.tparams, self.dparams, *args, **pre_static)
            if self.mesh is not None:  # caches and recurrent states by heads, the rest replicated
                shapes = sharding.state_shardings(shapes, self.mesh)
            self._state_shapes[key] = shapes
        return self._state_shapes[key]

    def _state_buffers(self, shapes) -> engine.State:
        """The buffers this request's prefill fills (`engine.prefill_into`): the last request's
        state if it has these shapes, else new zeros (the kept state released first, so that two
        sets of caches are never held at once). Reused buffers keep the rounds' command buffers
        valid: no per-call update on the GPU (`engine._prefill_into`)."""
        with self._kept_lock:
            kept, self._kept = self._kept, None
        if kept is not None and _same_shapes(kept, shapes):
            return kept
        del kept
        return sharding.zeros_like_shapes(shapes)

    def release_buffers(self) -> None:
        """Drop the state kept from the last request (its caches: memory the next request of the
        same shapes would reuse)."""
        with self._kept_lock:
            self._kept = None

    def _kept_bytes(self) -> int:
        kept = self._kept
        return 0 if kept is None else (tree_nbytes if self.mesh is None else sharding.per_device_nbytes)(kept)

    @staticmethod
    def _emit(state, emitted, on_tokens, finished: set[int]) -> bool:
        """Pass each row's new tokens to on_tokens; whether every row is done or finished."""
        out, out_len, done = np.asarray(state.out), np.asarray(state.out_len), np.asarray(state.done)
        for i in range(len(emitted)):
            if out_len[i] > emitted[i] and i not in finished:
                if on_tokens(i, out[i, emitted[i]: out_len[i]].tolist()):
                    finished.add(i)
                emitted[i] = int(out_len[i])
        return all(done[i] or i in finished for i in range(len(emitted)))
