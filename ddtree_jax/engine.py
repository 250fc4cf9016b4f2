"""The speculative round and the on-device generation loop.

One round: draft -> build tree -> verify -> walk -> commit. Every stage is its own
function below; `round_step` chains them and `run_rounds` loops it in a `lax.while_loop`, so a
whole generation runs on the device without a host round-trip per round. Plain autoregressive
decoding is budget 0 (the tree is the root alone); DFlash is the `chain` policy.

Invariants of `State` (per batch row):
  * `length`: tokens whose K/V (a hybrid target: also whose recurrent states) are in the target
    cache; the committed sequence is those tokens plus `root`, the last committed token, at
    position `length`.
  * The drafter's cache holds the context K/V of exactly the same `length` tokens.
  * `out[:out_len]` are the generated tokens (the first one came from the prefill).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.drafters import dflash2
from ddtree_jax.models.config import DrafterConfig, TargetConfig
from ddtree_jax.models.family import HybridCache, family_of
from ddtree_jax.models.layers import KVCache
from ddtree_jax.drafters.oracle import oracle_logp
from ddtree_jax.sampling import SamplingConfig, choose_tokens
from ddtree_jax.trees import DraftTree, make_policy
from ddtree_jax.cost import CostLines, chain_path_logp, choose_budget
from ddtree_jax.tuning import CPU, KernelTuning, Tuning
from ddtree_jax.walk import WalkResult, walk
from ddtree_jax.kernels import dispatch


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
    """Everything static about a generation: changing any field recompiles."""

    budget: int = 0  # draft nodes verified per round; 0 = plain autoregressive decoding
    policy: str = "ddtree"
    cache_size: int = 1024  # target/drafter cache positions
    out_size: int = 256  # output buffer (max_new_tokens bucket)
    sampling: SamplingConfig = SamplingConfig()
    drafter: str = "dflash"  # "dflash", or "oracle" (drafters/oracle.py: tests and benchmarks)
    # How the kernels and the tree build run on this device (tuning.tuning_for), the user's
    # attention / matmul / cache impls folded into its `kernels` (Generator).
    tuning: Tuning = CPU
    unroll: int = 1  # rounds per while_loop iteration (steps past max_rounds run but commit nothing)
    # Longest prompt piece one target forward takes: a longer prompt is prefilled in chunks of
    # this many tokens (a lax.scan; each chunk sees the cache of the ones before it). Bounds the
    # attention's T: the Pallas kernel unrolls its new-key steps (T = 8192 compiled for minutes
    # on the H200) and the XLA path's scores grow as T x (S + T).
    prefill_chunk: int = 1024
    # `--budget auto`: the candidates (a DDTree budget n: the policy's tree at `budget`, the
    # largest, cut to its first n nodes; "dflash": the drafter's top-1 chain) and their round
    # costs; each round verifies the one with the most expected tokens a millisecond (`auto_stage`).
    auto: CostLines | None = None

    @property
    def speculative(self) -> bool:
        return self.budget > 0


def num_nodes(spec: DecodeSpec, dcfg: DrafterConfig | None) -> int:
    """The most draft nodes a round of `spec` verifies (static)."""
    if not spec.speculative:
        return 0
    n = make_policy(spec.policy).num_nodes(spec.budget, dcfg.depth)
    if spec.auto is not None and "dflash" in spec.auto.candidates:
        n = max(n, dcfg.depth)
    return n


def round_xla_options(spec: DecodeSpec, dcfg: DrafterConfig | None) -> dict:
    """The XLA options of the round executables of `spec` (its tuning's, by verify rows)."""
    return spec.tuning.xla_options(1 + num_nodes(spec, dcfg))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class State:
    cache: KVCache | HybridCache  # the target's (models.family)
    dcache: KVCache | None
    length: jax.Array  # int32 [Bt]
    root: jax.Array  # int32 [Bt]
    out: jax.Array  # int32 [Bt, out_size + slack]
    out_len: jax.Array  # int32 [Bt]
    max_new: jax.Array  # int32 [Bt]
    done: jax.Array  # bool [Bt]
    rounds: jax.Array  # int32 [Bt]
    accept: jax.Array  # int32 [Bt, out_size]: tokens committed by each round (bonus included)
    key: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Knobs:
    """Traced generation settings: changing them does not recompile."""

    temperature: jax.Array  # f32 []
    top_p: jax.Array  # f32 []
    stop_ids: jax.Array  # int32 [n], -1 = unused


def make_knobs(temperature: float = 0.0, top_p: float = 1.0, stop_ids=()) -> Knobs:
    """Numpy values in one device_put: jnp.float32(x) launches a conversion (five small inputs
    took 0.9-1.4 ms through jnp on the H200, 0.35-0.43 this way)."""
    ids = list(stop_ids) or [-1]
    return Knobs(*jax.device_put((np.float32(temperature), np.float32(top_p), np.asarray(ids, np.int32))))


# ----------------------------------------------------------------------------- stages


def round_kernels(spec: DecodeSpec, dcfg: DrafterConfig | None) -> KernelTuning:
    """The kernels of a round's stages: the spec's, traced as parts of an executable compiled with
    the round's XLA options (`round_xla_options`, a function of the static spec), so that the
    skinny-matmul table's entries for those executables apply. Options given to a Generator's
    constructor on top are not seen here (profile.py adds them for its stage executables)."""
    return spec.tuning.kernels.compiled_with(round_xla_options(spec, dcfg))


def drafter_kernels(spec: DecodeSpec, dcfg: DrafterConfig | None) -> KernelTuning:
    """round_kernels for the drafter's calls (Tuning.drafter)."""
    return spec.tuning.drafter.compiled_with(round_xla_options(spec, dcfg))


def float32_exact(fn):
    """fn traced with full-precision float32 products where its first argument (the target's or
    the drafter's params) holds float32 weights: JAX's default on NVIDIA GPUs is TF32, which cannot
    resolve logit gaps of 1e-4 and rounds a many-row verify differently from a one-row step.
    Other dtypes keep their default."""
    @functools.wraps(fn)
    def wrapped(params, *args, **kw):
        weight = (params.get("embed", params.get("fc")) if isinstance(params, dict) else None)
        if getattr(weight, "dtype", None) == jnp.float32:
            with jax.default_matmul_precision("highest"):
                return fn(params, *args, **kw)
        return fn(params, *args, **kw)

    return wrapped


def draft_stage(tparams, dparams, state: State, *, tcfg: TargetConfig, dcfg: DrafterConfig, spec: DecodeSpec):
    """Drafter pass over [root, MASK x D]: log-probs [Bt, D, V] for the D future positions (V' of
    a token map's ids, in its order, for a drafter restricted to one: see `tree_stage`)."""
    if spec.drafter == "oracle":
        return oracle_logp(dparams, state.length, dcfg.depth, tcfg.vocab_size)
    kernels = drafter_kernels(spec, dcfg)
    bt = state.root.shape[0]
    bs = dcfg.block_size
    block = jnp.full((bt, bs), dcfg.mask_token_id, jnp.int32).at[:, 0].set(state.root)
    pos = state.length[:, None] + jnp.arange(bs, dtype=jnp.int32)
    if isinstance(dcfg, dflash2.DFlash2Config):  # DFlash 2: conv-wrapped layers, then its selector's log-probs
        return dflash2.draft_stage(tparams, dparams, block, pos, state.dcache, state.length, tcfg=tcfg, dcfg=dcfg,
                                   kernels=kernels)
    fam = family_of(tcfg)
    h = dmodel.draft_hidden(dparams, dcfg, fam.embed(tparams, block), pos, state.dcache, state.length,
                            kernels=kernels)
    if "lm_head" in dparams:  # its own copy of the head: quantized, or a token map's columns
        logits = dispatch.matmul(kernels, h[:, 1:], dparams["lm_head"], out_dtype=jnp.float32)
    else:
        logits = fam.lm_head(tparams, tcfg, h[:, 1:], kernels=kernels)
    return jax.nn.log_softmax(logits, axis=-1)


def tree_stage(logp: jax.Array, state: State, vocab: jax.Array | None = None, *, spec: DecodeSpec) -> DraftTree:
    """The policy's tree over the drafter's log-probs. vocab (int32 [V'], a drafter restricted to a
    token map: `draft_vocab`) turns the policy's indices into V' back into token ids."""
    tree = make_policy(spec.policy).with_tuning(spec.tuning.tree).build(logp, spec.budget)
    if vocab is not None:
        tree = dataclasses.replace(tree, tokens=jnp.take(vocab, tree.tokens, mode="clip"))
    return tree.with_root_token(state.root)


def auto_stage(logp: jax.Array, state: State, vocab: jax.Array | None = None, *, spec: DecodeSpec,
               depth: int) -> tuple[jax.Array, list[DraftTree]]:
    """`--budget auto`: every candidate's tree and the index of the one this round verifies, the
    candidate whose expected tokens (1 + the path probabilities of its nodes under the drafter,
    DDTree's objective, summed over the rows still generating) per ms of `spec.auto`'s cost at
    the rows' mean length is highest. The choice reads the drafter's log-probs only, so every
    candidate keeps the round lossless."""
    lines = spec.auto
    big = make_policy(spec.policy).with_tuning(spec.tuning.tree).build(logp, spec.budget)
    trees, chain_logp = [], None
    for c in lines.candidates:
        if c == "dflash":
            tree = make_policy("chain").with_tuning(spec.tuning.tree).build(logp, depth)
            chain_logp = chain_path_logp(logp)
        else:
            tree = big.first(c)
        if vocab is not None:
            tree = dataclasses.replace(tree, tokens=jnp.take(vocab, tree.tokens, mode="clip"))
        trees.append(tree.with_root_token(state.root))
    active = ~state.done
    prefix = jnp.sum(jnp.where(active, state.length, 0)) / jnp.maximum(jnp.sum(active), 1)
    # the policy's slot order is the order its nodes are cut in, so the first n slots count
    k = choose_budget(big.path_logp(logp), lines.candidates, lines.at(prefix), active, chain_logp=chain_logp,
                      presorted=True)
    return k, trees


def draft_vocab(dparams) -> jax.Array | None:
    """The token map of a drafter restricted to part of the vocabulary (drafters.dflash.
    restrict_vocab: its LM head holds those columns only), else None."""
    return dparams.get("draft_vocab") if isinstance(dparams, dict) else None


def root_tree(state: State) -> DraftTree:
    """The tree of plain decoding: the root alone."""
    return DraftTree.root_only(state.root.shape[0]).with_root_token(state.root)


def verify_stage(tparams, state: State, tree: DraftTree, *, tcfg: TargetConfig, dcfg: DrafterConfig | None,
                 spec: DecodeSpec):
    """One target pass over [root ; tree nodes]; returns logits [Bt, N+1, V], taps, and what the
    commit reads (the new K/V; a hybrid target's models.hybrid.VerifyOut)."""
    pos = state.length[:, None] + tree.depths
    taps = dcfg.target_layer_ids if (spec.speculative and spec.drafter == "dflash") else ()
    t = tree.tokens.shape[1]
    kernels = round_kernels(spec, dcfg)
    rows = dispatch.verify_rows(kernels, t, tcfg.num_heads, tcfg.num_kv_heads, tcfg.head_dim, tparams["embed"].dtype,
                                cache_size=spec.cache_size, batch=tree.tokens.shape[0])
    fam = family_of(tcfg)
    parents = None
    if fam.needs_parents:
        tokens, pos, mask, parents = pad_verify_rows(tree.tokens, pos, tree.ancestor_mask, rows, tree.parents)
    else:
        tokens, pos, mask = pad_verify_rows(tree.tokens, pos, tree.ancestor_mask, rows)
    h, tapped, new_kv = fam.verify(tparams, tcfg, tokens, pos, parents, mask, state.cache, state.length, taps=taps,
                                   kernels=kernels)
    # Padding rows' hidden states are dropped here; their taps and K/V are never read (commit
    # gathers the accepted path's rows only).
    if rows != t:
        h = h[:, :t]
    return fam.lm_head(tparams, tcfg, h, kernels=kernels), tapped, new_kv


def pad_verify_rows(tokens: jax.Array, pos: jax.Array, mask: jax.Array, rows: int, parents: jax.Array | None = None):
    """The verify's inputs grown from T to `rows` rows (ddtree_jax.kernels.dispatch.verify_rows): a padding row
    repeats the last token and position and sees only itself, and no real row sees it, so the
    real rows' attention, and with it every real output, is what it was. With `parents` (a
    hybrid target's recurrence reads them) also those, a padding row a root of its own (-1),
    as a fourth result."""
    bt, t = tokens.shape
    if rows == t:
        return (tokens, pos, mask) if parents is None else (tokens, pos, mask, parents)
    extra = rows - t
    tokens = jnp.pad(tokens, ((0, 0), (0, extra)), mode="edge")
    pos = jnp.pad(pos, ((0, 0), (0, extra)), mode="edge")
    idx = jnp.arange(rows)
    self_only = (idx[:, None] == idx[None, :]) & (idx[:, None] >= t)
    mask = jnp.pad(mask, ((0, 0), (0, extra), (0, extra))) | self_only[None]
    if parents is None:
        return tokens, pos, mask
    return tokens, pos, mask, jnp.pad(parents, ((0, 0), (0, extra)), constant_values=-1)


def commit_stage(
    dparams, state: State, new_kv, tapped, result: WalkResult, knobs: Knobs, *,
    dcfg: DrafterConfig | None, spec: DecodeSpec, slots: int, enabled: jax.Array | None = None,
) -> State:
    # slots: tree slots (N+1) the next round will write beyond `length`.
    """Keep the accepted path: write its target K/V, feed the drafter, append tokens, check stops.

    enabled=False (a bool scalar) makes the round a no-op for every row: its cache writes land
    beyond each row's length, where nothing reads them.
    """
    active = ~state.done if enabled is None else ~state.done & enabled
    n_new = result.num_accepted + 1  # accepted nodes + the bonus token
    # The root and the accepted nodes' K/V go to length .. length+num_accepted (the rest of the
    # path's D+1 entries land beyond the new length and are overwritten later).
    cache = family_of(state.cache).commit(state.cache, new_kv, state.length, result.path, n_new, active,
                                          kernels=spec.tuning.kernels)
    dcache = state.dcache
    if spec.speculative:
        if spec.drafter == "dflash":
            ctx = jnp.take_along_axis(tapped, result.path[:, :, None], axis=1)
            ctx_pos = state.length[:, None] + jnp.arange(result.path.shape[1], dtype=jnp.int32)
            dcache = dmodel.extend_cache(dparams, dcfg, state.dcache, state.length, ctx, ctx_pos,
                                         kernels=drafter_kernels(spec, dcfg))

    # Stop ids and max_new_tokens cut the round's tokens by position (never by token value).
    emitted = result.tokens  # [Bt, D+1]; the first n_new are real
    idx = jnp.arange(emitted.shape[1], dtype=jnp.int32)
    is_stop = (emitted[:, :, None] == knobs.stop_ids[None, None, :]).any(-1) & (idx[None] < n_new[:, None])
    first_stop = jnp.where(is_stop.any(-1), jnp.argmax(is_stop, axis=-1), emitted.shape[1])
    room = state.max_new - state.out_len
    n_out = jnp.minimum(jnp.minimum(n_new, first_stop + 1), room)
    n_out = jnp.where(active, n_out, 0)
    out = jax.vmap(lambda o, e, s: jax.lax.dynamic_update_slice(o, e, (s,)))(state.out, emitted, state.out_len)
    out_len = state.out_len + n_out
    stopped = is_stop.any(-1) & (first_stop < n_new)
    cache_full = state.length + n_new + slots + result.path.shape[1] > spec.cache_size
    done = state.done | (active & (stopped | (out_len >= state.max_new) | cache_full))
    accept = jax.vmap(lambda a, r, n: a.at[r].set(n))(state.accept, jnp.minimum(state.rounds, state.accept.shape[1] - 1),
                                                     jnp.where(active, n_new, 0))
    return dataclasses.replace(
        state,
        cache=cache,
        dcache=dcache,
        length=jnp.where(active, state.length + n_new, state.length),
        root=jnp.where(active, result.bonus, state.root),
        out=out,
        out_len=out_len,
        done=done,
        rounds=state.rounds + active.astype(jnp.int32),
        accept=accept,
    )


# ----------------------------------------------------------------------------- round and loop


def draw_positions(state: State, tree: DraftTree) -> jax.Array:
    """int32 [Bt, N]: the position of the token each tree node's logits draw (a node at position
    p draws position p + 1's; sampling.py keys the noise by it)."""
    return state.length[:, None] + tree.depths + 1


def round_step(tparams, dparams, tcfg, dcfg, state: State, knobs: Knobs, spec: DecodeSpec,
               enabled: jax.Array | None = None) -> State:
    """One round; enabled=False (traced bool) computes it but commits nothing."""
    depth = dcfg.depth if spec.speculative else 0
    if spec.speculative:
        with jax.named_scope("draft"):
            logp = draft_stage(tparams, dparams, state, tcfg=tcfg, dcfg=dcfg, spec=spec)
        with jax.named_scope("tree"):
            if spec.auto is not None:
                choice, trees = auto_stage(logp, state, draft_vocab(dparams), spec=spec, depth=depth)
            else:
                choice, trees = None, [tree_stage(logp, state, draft_vocab(dparams), spec=spec)]
    else:
        choice, trees = None, [root_tree(state)]
    slots = max(t.tokens.shape[1] for t in trees)  # the next round writes at most this many beyond length

    def verify_and_walk(tree: DraftTree, state: State):
        """The target's verify of `tree` and the walk of its tokens: (K/V of every row, taps, walk result)."""
        with jax.named_scope("verify"):
            logits, tapped, new_kv = verify_stage(tparams, state, tree, tcfg=tcfg, dcfg=dcfg, spec=spec)
            target_tokens = choose_tokens(state.key, logits, spec.sampling, knobs.temperature, knobs.top_p,
                                          draw_positions(state, tree), spec.tuning.kernels.deterministic)
        with jax.named_scope("walk"):
            return new_kv, tapped, walk(tree, target_tokens, depth)

    def verified_path(tree: DraftTree, state: State):
        """verify_and_walk cut to the accepted path: the path's rows in order, so result.path is the identity."""
        new_kv, tapped, result = verify_and_walk(tree, state)
        path = result.path
        kv = family_of(tcfg).take_path(new_kv, path)
        if tapped is not None:
            tapped = jnp.take_along_axis(tapped, path[:, :, None], axis=1)
        ident = jnp.broadcast_to(jnp.arange(path.shape[1], dtype=path.dtype), path.shape)
        return kv, tapped, dataclasses.replace(result, path=ident)

    if choice is None:  # one tree: the commit reads the accepted rows from the full K/V, no gather before it
        kv, tapped, result = verify_and_walk(trees[0], state)
    else:
        # One verify shape a round: each candidate's verify and walk compiled, the chosen one run.
        # The branches return only the accepted path's K/V and taps (the same shapes whatever the
        # tree) and the commit runs after the switch: a state with the caches through the switch
        # makes XLA copy every cache around it (~0.4 ms a round at the 8B shape).
        kv, tapped, result = jax.lax.switch(choice, [functools.partial(verified_path, t) for t in trees], state)
    with jax.named_scope("commit"):
        return commit_stage(dparams, state, kv, tapped, result, knobs, dcfg=dcfg, spec=spec, slots=slots,
                            enabled=enabled)


def _run_rounds(tparams, dparams, state: State, knobs: Knobs, max_rounds: jax.Array, *, tcfg, dcfg, spec):
    def cond(carry):
        s, i = carry
        return (i < max_rounds) & ~jnp.all(s.done)

    def body(carry):
        s, i = carry

        def step(j, s):  # with one step per iteration, cond already checked i
            enabled = None if spec.unroll == 1 else i + j < max_rounds
            return round_step(tparams, dparams, tcfg, dcfg, s, knobs, spec, enabled=enabled)

        for j in range(spec.unroll):
            s = step(j, s)
        return s, i + spec.unroll

    state, _ = jax.lax.while_loop(cond, body, (state, jnp.int32(0)))
    return state


run_rounds = jax.jit(float32_exact(_run_rounds), static_argnames=("tcfg", "dcfg", "spec"), donate_argnames=("state",))


def new_caches(tcfg: TargetConfig, dcfg: DrafterConfig | None, spec: DecodeSpec, batch: int, dtype):
    """Fresh target (and drafter) caches, allocated outside the jitted functions and donated to them."""
    cache = family_of(tcfg).new_cache(tcfg, batch, spec.cache_size, dtype)
    dcache = None
    if spec.speculative and spec.drafter == "dflash":
        dcache = KVCache.zeros(dcfg.num_layers, batch, dcfg.num_kv_heads, spec.cache_size, dcfg.head_dim, dtype)
    return cache, dcache


@float32_exact
def _prefill(tparams, dparams, cache: KVCache | HybridCache, dcache: KVCache | None, prompt: jax.Array,
             prompt_len: jax.Array, max_new: jax.Array, knobs: Knobs, key: jax.Array, start: jax.Array | None = None, *,
             tcfg: TargetConfig, dcfg: DrafterConfig | None, spec: DecodeSpec) -> State:
    """Prompt pass: fills both caches (from `new_caches`), chooses the first token (the first root).

    start (int32[Bt]): the prompt goes to positions start.. of caches whose first `start`
    positions hold what came before it (a conversation's earlier turns); None: from 0."""
    bt, p = prompt.shape
    # Positions and masks derived from an argument, not literals: XLA would otherwise
    # constant-fold the masked attention over the empty prefix (seconds of compile time).
    if start is None:
        start = jax.lax.optimization_barrier(jnp.zeros_like(prompt_len, jnp.int32))
    taps = dcfg.target_layer_ids if (spec.speculative and spec.drafter == "dflash") else ()
    cache, h, tapped = _prefill_target(tparams, tcfg, cache, prompt, prompt_len, start, taps, spec)
    pos = start[:, None] + jnp.arange(p, dtype=jnp.int32)
    last = jnp.take_along_axis(h, (prompt_len - 1)[:, None, None], axis=1)[:, 0]
    kernels = spec.tuning.kernels
    first = choose_tokens(key, family_of(tcfg).lm_head(tparams, tcfg, last, kernels=kernels), spec.sampling,
                          knobs.temperature, knobs.top_p, start + prompt_len.astype(jnp.int32), kernels.deterministic)
    if dcache is not None:  # the prompt's context K/V through XLA's writes
        dcache = dmodel.extend_cache(dparams, dcfg, dcache, start, tapped, pos,
                                     kernels=spec.tuning.drafter.with_impls(cache="xla"))
    slack = (dcfg.block_size if spec.speculative else 1) + 1
    out = jnp.zeros((bt, spec.out_size + slack), jnp.int32).at[:, 0].set(first)
    is_stop = (first[:, None] == knobs.stop_ids[None, :]).any(-1)
    return State(
        cache=cache,
        dcache=dcache,
        length=start + prompt_len.astype(jnp.int32),
        root=first,
        out=out,
        out_len=jnp.ones((bt,), jnp.int32),
        max_new=max_new.astype(jnp.int32),
        done=is_stop | (max_new <= 1),
        rounds=jnp.zeros((bt,), jnp.int32),
        accept=jnp.zeros((bt, spec.out_size), jnp.int32),
        key=key,
    )


def _prefill_target(tparams, tcfg: TargetConfig, cache: KVCache | HybridCache, prompt: jax.Array,
                    prompt_len: jax.Array, start: jax.Array, taps: tuple[int, ...], spec: DecodeSpec):
    """The target over the prompt, in pieces of at most spec.prefill_chunk tokens: returns (cache
    with the prompt's K/V, final-normed hidden [Bt, P, H], taps [Bt, P, nTaps*H] or None).

    Piece i attends to the cache's first start + i*chunk positions and causally to itself, which is the
    whole prompt's causal attention. Full pieces run in one lax.scan (one compiled forward); a
    shorter last piece (P not a multiple of the chunk) in one more forward.
    """
    bt, p = prompt.shape
    fam = family_of(tcfg)

    def piece(cache, tokens, first, offset):  # first = start + offset, the piece's first position
        return fam.prefill(tparams, tcfg, cache, tokens, first, prompt_len, offset, taps=taps,
                           kernels=spec.tuning.kernels)

    chunk = max(1, spec.prefill_chunk)
    if p <= chunk:
        return piece(cache, prompt, start, 0)
    n, rest = divmod(p, chunk)

    def body(cache, i):
        tokens = jax.lax.dynamic_slice_in_dim(prompt, i * chunk, chunk, axis=1)
        cache, h, tapped = piece(cache, tokens, start + i * chunk, i * chunk)
        return cache, (h, tapped)

    cache, (hs, taps_out) = jax.lax.scan(body, cache, jnp.arange(n, dtype=jnp.int32))

    def join(x, tail):  # [n, Bt, chunk, ...] (+ [Bt, rest, ...]) -> [Bt, P, ...]
        if x is None:
            return None
        x = jnp.swapaxes(x, 0, 1).reshape(bt, n * chunk, *x.shape[3:])
        return x if tail is None else jnp.concatenate([x, tail], axis=1)

    h_tail = tap_tail = None
    if rest:
        cache, h_tail, tap_tail = piece(cache, prompt[:, n * chunk:], start + n * chunk, n * chunk)
    return cache, join(hs, h_tail), join(taps_out, tap_tail)


prefill = jax.jit(_prefill, static_argnames=("tcfg", "dcfg", "spec"), donate_argnames=("cache", "dcache"))


def _prefill_into(old: State, tparams, dparams, prompt: jax.Array, prompt_len: jax.Array, max_new: jax.Array,
                  knobs: Knobs, key: jax.Array, *, tcfg: TargetConfig, dcfg: DrafterConfig | None,
                  spec: DecodeSpec) -> State:
    """`_prefill` in the buffers of `old`, a state of the same shapes (`state_shapes` as zeros, or
    a finished request's), donated whole: its caches are zeroed (as `new_caches` makes them) and refilled, and
    each leaf of the new state takes the buffer of the same leaf of `old`. Requests that reuse one
    state run their rounds on the same addresses, so XLA need not update the rounds' command
    buffers (CUDA graphs) at a call's first round: 3.5-5.3 ms a call (DDTree-64, 8B shape, H200)
    when every call got new buffers, none with them kept."""
    def zeros(c):
        return None if c is None else jax.tree_util.tree_map(jnp.zeros_like, c)

    return _prefill(tparams, dparams, zeros(old.cache), zeros(old.dcache), prompt, prompt_len, max_new, knobs, key,
                    tcfg=tcfg, dcfg=dcfg, spec=spec)


# keep_unused: the old state's leaves other than the caches are not read, but must stay arguments
# to be donated (and taken by the outputs of the same shapes, in order)
prefill_into = jax.jit(_prefill_into, static_argnames=("tcfg", "dcfg", "spec"), donate_argnames=("old",),
                       keep_unused=True)


def _prefill_continue(old: State, tparams, dparams, prompt: jax.Array, prompt_len: jax.Array, start: jax.Array,
                      max_new: jax.Array, knobs: Knobs, key: jax.Array, *, tcfg: TargetConfig,
                      dcfg: DrafterConfig | None, spec: DecodeSpec) -> State:
    """`_prefill` of the next part of a conversation into the state of its last request, donated
    whole: the caches keep their first `start` positions (the conversation so far, which the
    new part attends to), the new part goes after them, and the rounds go on from there."""
    return _prefill(tparams, dparams, old.cache, old.dcache, prompt, prompt_len, max_new, knobs, key, start,
                    tcfg=tcfg, dcfg=dcfg, spec=spec)


prefill_continue = jax.jit(_prefill_continue, static_argnames=("tcfg", "dcfg", "spec"), donate_argnames=("old",),
                           keep_unused=True)


def state_shapes(tparams, dparams, prompt: jax.Array, prompt_len: jax.Array, max_new: jax.Array, knobs: Knobs,
                 key: jax.Array, *, tcfg: TargetConfig, dcfg: DrafterConfig | None, spec: DecodeSpec) -> State:
    """The shapes (ShapeDtypeStructs) of the state `prefill` returns for these arguments (arrays
    or ShapeDtypeStructs): what `prefill_into`'s first request allocates as zeros."""
    caches = jax.eval_shape(lambda: new_caches(tcfg, dcfg, spec, prompt.shape[0], tparams["embed"].dtype))
    return jax.eval_shape(functools.partial(_prefill, tcfg=tcfg, dcfg=dcfg, spec=spec), tparams, dparams, *caches,
                          prompt, prompt_len, max_new, knobs, key)


def prefill_spec(spec: DecodeSpec) -> DecodeSpec:
    """The part of `spec` the prefill reads: specs that differ in the tree alone (policy, a budget
    above 0, auto's candidates, the loop's unroll) share one prefill executable."""
    return dataclasses.replace(spec, budget=min(spec.budget, 1), policy=DecodeSpec.policy, unroll=DecodeSpec.unroll,
                               auto=None)
