"""Losslessness of the round engine: every method, policy and budget gives the AR tokens."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax import engine
from ddtree_jax.generator import Executables, Generator
from ddtree_jax.sampling import SamplingConfig
from ddtree_jax.trees import available_policies
from tiny import oracle_params, tiny_pair

PROMPTS = [[5], [3, 9], [1, 2, 3, 4, 5, 6, 7], list(range(10, 23)), list(range(2, 33))]
MAX_NEW = 40
POLICY_SPECS = {"ddtree": "ddtree", "chain": "chain", "beam": "beam:width=3", "static": "static:tree=0;1;2;0.0;0.1;1.0;0.0.0"}

# the module's Generators share what they compile alike (the prefill of a request shape, above all)
SHARED = Executables()


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


@pytest.fixture(scope="module")
def ar_tokens(pair):
    return [r.token_ids for r in Generator(pair, executables=SHARED, method="ar").generate_ids(PROMPTS, max_new_tokens=MAX_NEW)]


def test_policies_cover_registry():
    assert set(POLICY_SPECS) == set(available_policies())


def test_dflash_equals_ar(pair, ar_tokens):
    res = Generator(pair, executables=SHARED, method="dflash").generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in res] == ar_tokens


@pytest.mark.parametrize("policy", sorted(POLICY_SPECS))
@pytest.mark.parametrize("budget", [1, 2, 7, 64, 256])
def test_ddtree_equals_ar_random_drafter(pair, ar_tokens, policy, budget):
    gen = Generator(pair, executables=SHARED, method="ddtree", policy=POLICY_SPECS[policy], budget=budget)
    res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in res] == ar_tokens
    for r in res:
        assert r.num_output_tokens == MAX_NEW
        assert sum(r.acceptance_lengths) == MAX_NEW - 1 or sum(r.acceptance_lengths) >= MAX_NEW - 1


@pytest.mark.parametrize("method,chunk", [("ar", 8), ("ar", 12), ("ddtree", 8), ("dflash", 5)])
def test_chunked_prefill_same_tokens(pair, ar_tokens, method, chunk):
    """A prompt longer than prefill_chunk is prefilled in pieces (a scan, plus a shorter last piece
    when the padded prompt, here 32 tokens, is not a multiple): the same tokens as one piece."""
    gen = Generator(pair, executables=SHARED, method=method, budget=7, prefill_chunk=chunk)
    assert [r.token_ids for r in gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)] == ar_tokens


@pytest.mark.parametrize("stage2_select,budget", [(False, 13), (True, 12)])
def test_gpu_vocab_top_k_inside_the_round_is_lossless(pair, ar_tokens, stage2_select, budget):
    """The GPU's per-chunk keep (with its lax.cond fallback; its first stage in the threshold
    kernel, its second by lax.top_k or by select_top), interpreted inside the fused round on the
    CPU: 12-13 ranks of a 64-token vocabulary from 4 chunks keeping 5 each (the fallback runs
    whenever a chunk holds more than 5 of them)."""
    from ddtree_jax.tuning import TreeTuning, Tuning, VocabTopK

    topk = VocabTopK(chunks=4, keep=5, keep_from_k=8, stage2_select=stage2_select)
    tuning = Tuning(tree=TreeTuning(kernels="pallas_interpret", vocab_topk=topk))
    gen = Generator(pair, executables=SHARED, method="ddtree", budget=budget, tuning=tuning)
    assert gen.spec_for(8, 8, SamplingConfig()).tuning.tree.vocab_topk == topk
    assert [r.token_ids for r in gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)] == ar_tokens


def test_gpu_selection_kernels_inside_the_round_are_lossless(pair, ar_tokens, monkeypatch):
    """The GPU's tree tuning with its selection kernels at every size (pair_select at every depth,
    runs_select for the final selection), interpreted inside the fused round on the CPU, with a
    noisy oracle so that acceptance runs through side branches: the AR tokens. (Any consistent
    tree is lossless: the kernels' exactness is tested in their own files.)"""
    import dataclasses

    from ddtree_jax.trees import ddtree
    from ddtree_jax.tuning import GPU_TREE, Tuning

    tree = dataclasses.replace(GPU_TREE, kernels="pallas_interpret", pair_kernel_from=1, runs_kernel_from=1,
                               vocab_topk=None)
    calls = []
    for name in ("pair", "runs"):
        real = getattr(ddtree, f"{name}_select")
        monkeypatch.setattr(ddtree, f"{name}_select",
                            lambda *a, real=real, name=name, **k: calls.append(name) or real(*a, **k))
    oracle = oracle_params(pair, PROMPTS, MAX_NEW, noise=1.5)
    got = Generator(pair, executables=SHARED, method="ddtree", budget=37, oracle=oracle, tuning=Tuning(tree=tree)).generate_ids(
        PROMPTS, max_new_tokens=MAX_NEW)
    assert set(calls) == {"pair", "runs"}
    assert [r.token_ids for r in got] == ar_tokens
    assert max(a for r in got for a in r.acceptance_lengths) > 2     # side branches were taken


def test_padded_verify_rows_are_lossless(pair, ar_tokens, monkeypatch):
    """The verify grown to a multiple of 8 rows (what the Mosaic GPU attention kernel needs:
    engine.pad_verify_rows): padding rows see only themselves and are dropped before the head, so
    the AR tokens come out, through side branches. Budget 41 (42 slots -> 48 rows) is used by no
    other test, so the round is traced afresh with the padding. No CPU tuning pads (padding goes
    with the Mosaic GPU kernel, which only compiles for Hopper), so the engine's row count is
    forced here while the attention runs on XLA."""
    import jax.numpy as jnp

    from ddtree_jax import engine

    seen = []
    monkeypatch.setattr(engine.dispatch, "verify_rows", lambda kernels, t, *a, **k: seen.append(t) or -(-t // 8) * 8)
    oracle = oracle_params(pair, PROMPTS, MAX_NEW, noise=1.5)
    got = Generator(pair, executables=SHARED, method="ddtree", budget=41, oracle=oracle).generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    assert 42 in seen
    assert [r.token_ids for r in got] == ar_tokens
    assert max(a for r in got for a in r.acceptance_lengths) > 2
    tokens, pos, mask = engine.pad_verify_rows(jnp.array([[4, 5, 6]]), jnp.array([[9, 10, 10]]),
                                               jnp.array([[[1, 0, 0], [1, 1, 0], [1, 0, 1]]], bool), 5)
    assert tokens.tolist() == [[4, 5, 6, 6, 6]] and pos.tolist() == [[9, 10, 10, 10, 10]]
    assert mask[0].astype(int).tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0],
                                            [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]


def test_oracle_drafter_accepted_to_full_depth(pair, ar_tokens):
    depth = pair.drafter_cfg.depth
    oracle = oracle_params(pair, PROMPTS, MAX_NEW)
    for method, budget in [("dflash", 0), ("ddtree", 64)]:
        gen = Generator(pair, executables=SHARED, method=method, budget=budget or 64, oracle=oracle)
        res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
        assert [r.token_ids for r in res] == ar_tokens
        for r in res:
            # every round commits D drafted tokens + the bonus
            assert r.acceptance_lengths == [depth + 1] * r.rounds
            assert r.rounds == -(-(MAX_NEW - 1) // (depth + 1))


@pytest.mark.parametrize("policy", ["ddtree", "beam:width=4"])
def test_noisy_oracle_deep_branches_lossless(pair, ar_tokens, policy):
    """A drafter whose right token is often not its top-1: acceptance runs through side branches."""
    oracle = oracle_params(pair, PROMPTS, MAX_NEW, noise=1.5)
    chain = Generator(pair, executables=SHARED, method="dflash", oracle=oracle).generate_ids(PROMPTS, max_new_tokens=MAX_NEW)
    tree = Generator(pair, executables=SHARED, method="ddtree", policy=policy, budget=64, oracle=oracle).generate_ids(
        PROMPTS, max_new_tokens=MAX_NEW)
    assert [r.token_ids for r in chain] == ar_tokens
    assert [r.token_ids for r in tree] == ar_tokens
    mean_chain = np.mean([a for r in chain for a in r.acceptance_lengths])
    mean_tree = np.mean([a for r in tree for a in r.acceptance_lengths])
    assert mean_tree > mean_chain, (mean_tree, mean_chain)
    if policy == "ddtree":  # best-first spends the budget where the drafter's mass is
        assert mean_tree > mean_chain + 0.5, (mean_tree, mean_chain)


def test_stop_token_inside_tree(pair, ar_tokens):
    """A stop id that the target emits mid-round ends the output right there, as in AR."""
    row = 2
    stop = ar_tokens[row][12]
    cut = ar_tokens[row].index(stop) + 1
    oracle = oracle_params(pair, PROMPTS, MAX_NEW)
    ar = Generator(pair, executables=SHARED, method="ar").generate_ids(PROMPTS, max_new_tokens=MAX_NEW, stop_ids=[stop])
    for method in ("dflash", "ddtree"):
        res = Generator(pair, executables=SHARED, method=method, budget=64, oracle=oracle).generate_ids(
            PROMPTS, max_new_tokens=MAX_NEW, stop_ids=[stop])
        assert [r.token_ids for r in res] == [r.token_ids for r in ar]
        assert res[row].token_ids == ar_tokens[row][:cut]


@pytest.mark.parametrize("max_new", [1, 2, 9])
def test_short_outputs(pair, ar_tokens, max_new):
    res = Generator(pair, executables=SHARED, method="ddtree", budget=16).generate_ids(PROMPTS, max_new_tokens=max_new)
    assert [r.token_ids for r in res] == [t[:max_new] for t in ar_tokens]


def test_streaming_and_profile_give_same_tokens(pair, ar_tokens):
    gen = Generator(pair, executables=SHARED, method="ddtree", budget=16)
    got = {i: [] for i in range(len(PROMPTS))}
    res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW, on_tokens=lambda i, ids: got[i].extend(ids),
                           rounds_per_call=3)
    assert [got[i] for i in range(len(PROMPTS))] == ar_tokens == [r.token_ids for r in res]
    prof = gen.generate_ids(PROMPTS[:1], max_new_tokens=MAX_NEW, profile=True)[0]
    assert prof.token_ids == ar_tokens[0]
    assert set(prof.stage_ms) == {"draft", "tree", "verify", "walk", "commit"}


def test_streaming_calls_grow(pair, ar_tokens):
    """Streamed AR from 1 round a call: calls of 1, 2, 4, ... rounds (capped), so few calls; and
    the streamed tokens are the plain ones."""
    from ddtree_jax.generator import STREAM_MAX_ROUNDS_PER_CALL

    calls = []
    res = Generator(pair, executables=SHARED, method="ar").generate_ids(
        PROMPTS[:1], max_new_tokens=MAX_NEW, on_tokens=lambda i, ids: calls.append(list(ids)), rounds_per_call=1)
    sizes = [len(c) for c in calls]
    assert sum(calls, []) == res[0].token_ids == ar_tokens[0]
    # the prefill emits the first token; then AR commits one token a round, and the last call may
    # end early at max_new_tokens or a stop token
    full = [min(2**i, STREAM_MAX_ROUNDS_PER_CALL) for i in range(len(sizes) - 1)]
    assert sizes[0] == 1 and sizes[1:-1] == full[:-1] and 1 <= sizes[-1] <= full[-1], sizes
    assert len(sizes) < MAX_NEW // 4


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_unrolled_loop_same_tokens_rounds_and_samples(pair, ar_tokens, method):
    """unroll=3 with 4 rounds per call (not a multiple): disabled steps commit nothing, the
    round count and acceptance history match, and sampled output keeps its key sequence."""
    base = Generator(pair, executables=SHARED, method=method, budget=16, unroll=1)
    unrolled = Generator(pair, executables=SHARED, method=method, budget=16, unroll=3)
    for temperature in (0.0, 1.0):
        runs = []
        for gen in (base, unrolled):
            got = {i: [] for i in range(len(PROMPTS))}
            res = gen.generate_ids(PROMPTS, max_new_tokens=MAX_NEW, temperature=temperature, seed=7,
                                   on_tokens=lambda i, ids, got=got: got[i].extend(ids), rounds_per_call=4)
            assert [got[i] for i in range(len(PROMPTS))] == [r.token_ids for r in res]
            runs.append([(r.token_ids, r.rounds, r.acceptance_lengths) for r in res])
        assert runs[0] == runs[1]
        if temperature == 0.0:
            assert [r[0] for r in runs[1]] == ar_tokens


def test_round_xla_options_by_tuning_and_rows(pair):
    """The tuning's XLA options go to the round executables whose verify row count (tree nodes +
    root) is in range, nowhere else, and the constructor's compiler_options override them; the
    H200 tuning forces split-K 1 for 33-65 rows only, other devices none."""
    import types

    from ddtree_jax import engine, tuning

    mine = tuning.Tuning(round_xla_options=((65, 65, (("opt_a", 1),)), (2, 300, (("opt_b", 2),))))
    dcfg = pair.drafter_cfg
    at = lambda budget, t=mine: engine.round_xla_options(engine.DecodeSpec(budget=budget, tuning=t), dcfg)
    assert at(64) == {"opt_a": 1}              # 65 rows: the first matching range wins
    assert at(16) == {"opt_b": 2} and at(0) == {}  # AR: one row
    assert at(64, tuning.H200) == {"xla_gpu_experimental_force_split_k": 1} and at(256, tuning.H200) == {}
    assert at(64, tuning.GPU) == {} and at(64, tuning.CPU) == {}
    h200 = types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H200", compute_capability="9.0", core_count=132)
    assert tuning.tuning_for(h200) == tuning.H200
    h100 = tuning.tuning_for(types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3"))
    assert (h100.tree, h100.round_xla_options) == (tuning.GPU.tree, ())
    assert tuning.tuning_for(types.SimpleNamespace(platform="cpu", device_kind="cpu")) == tuning.CPU
    gen = Generator(pair, executables=SHARED, method="ddtree", budget=64, compiler_options={"opt_a": 5, "opt_c": 0}, tuning=mine)
    assert gen.round_options(engine.DecodeSpec(budget=64, tuning=mine)) == {"opt_a": 5, "opt_c": 0}
    assert gen.round_options(engine.DecodeSpec(budget=16, tuning=mine)) == {"opt_a": 5, "opt_b": 2, "opt_c": 0}


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_requests_reuse_the_last_state_buffers(pair, ar_tokens, method):
    """A request of the shapes of the one before prefills into its state's buffers (donated: the
    rounds' command buffers keep their addresses), caches zeroed first: after a longer prompt of
    the same bucket, a shorter one gives the AR tokens, greedy, and a sampled one the tokens of a
    fresh Generator; a request of other shapes (a longer output) takes new buffers;
    release_buffers drops them; the calls' round limits are device scalars made once a value."""
    import jax

    def ptrs(state):
        return [x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(state)]

    gen = Generator(pair, executables=SHARED, method=method, budget=7)
    assert [r.token_ids for r in gen.generate_ids([PROMPTS[3]], max_new_tokens=MAX_NEW)] == [ar_tokens[3]]
    kept = ptrs(gen._kept)
    assert [r.token_ids for r in gen.generate_ids([PROMPTS[2]], max_new_tokens=MAX_NEW)] == [ar_tokens[2]]
    assert ptrs(gen._kept) == kept  # every leaf in the buffer it had
    sampled = dict(max_new_tokens=MAX_NEW, temperature=0.9, top_p=0.9, seed=3)
    fresh = Generator(pair, executables=SHARED, method=method, budget=7).generate_ids([PROMPTS[3]], **sampled)
    assert [r.token_ids for r in gen.generate_ids([PROMPTS[3]], **sampled)] == [r.token_ids for r in fresh]
    assert ptrs(gen._kept) == kept
    out_shape = gen._kept.out.shape
    longer = gen.generate_ids([PROMPTS[4]], max_new_tokens=2 * MAX_NEW)  # another output bucket
    assert longer[0].token_ids[:MAX_NEW] == ar_tokens[4]
    assert gen._kept.out.shape != out_shape  # other shapes: new buffers
    gen.release_buffers()
    assert gen._kept is None
    assert [r.token_ids for r in gen.generate_ids([PROMPTS[2]], max_new_tokens=MAX_NEW)] == [ar_tokens[2]]
    # the calls' round limits: one device scalar per value, made once
    assert gen._limits and all(int(v) == n for n, v in gen._limits.items())
    n = next(iter(gen._limits))
    assert gen.rounds_limit(n) is gen._limits[n] and int(gen.rounds_limit(5)) == 5


def test_check_memory_counts_the_kept_state_as_reusable(pair, monkeypatch):
    """The device's bytes in use include the state kept from the last request; a request reuses or
    frees it before allocating, so the memory check does not count it twice (and does count memory
    held by anything else)."""
    import jax

    from ddtree_jax import generator as generate_mod
    from ddtree_jax.errors import UserError

    gen = Generator(pair, executables=SHARED, method="ar")
    gen.generate_ids([PROMPTS[2]], max_new_tokens=8)
    kept = gen._kept_bytes()
    weights = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(gen.tparams))
    assert kept > 0

    class Device:
        device_kind = "fake"

        @staticmethod
        def memory_stats():  # the kept state in use, room for half as much again
            return {"bytes_in_use": weights + kept, "bytes_limit": weights + kept + kept // 2}

    monkeypatch.setattr(generate_mod.jax, "devices", lambda *a: [Device()])
    spec = gen.spec_for(len(PROMPTS[2]), 8, SamplingConfig())
    gen.check_memory(1, spec)  # the kept caches are this request's: it fits
    gen.release_buffers()  # now the same bytes in use belong to something else
    with pytest.raises(UserError, match="not enough device memory"):
        gen.check_memory(1, spec)


def test_a_call_takes_few_buffers(pair):
    """Every buffer a call takes costs host time (~3 us a leaf on the H200), so the state
    holds each model's KV cache as two arrays (every layer's K, every layer's V) and, where
    kernels read the norm weights, the inference layout stacks them (none left in a layer's
    dict). Where only XLA reads them (the CPU's "auto") they stay per layer: a stacked row is a
    constant-index read that makes each layer's norm fusion one more to compile."""
    import jax

    gen = Generator(pair, executables=SHARED, method="ddtree", budget=7, matmul_impl="pallas_interpret")
    plain = Generator(pair, executables=SHARED, method="ddtree", budget=7)
    out = gen.generate_ids([PROMPTS[1]], max_new_tokens=8)[0]
    assert plain.generate_ids([PROMPTS[1]], max_new_tokens=8)[0].token_ids == out.token_ids
    state = gen._kept
    for cache, cfg in ((state.cache, pair.target_cfg), (state.dcache, pair.drafter_cfg)):
        assert len(jax.tree_util.tree_leaves(cache)) == 2
        assert cache.k.shape == cache.v.shape and cache.k.shape[:3] == (cfg.num_layers, 1, cfg.num_kv_heads)
    for params, cfg in ((gen.tparams, pair.target_cfg), (gen.dparams, pair.drafter_cfg)):
        names = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
        assert not [n for n in names if "layers" in n and "norm" in n], names
        assert params["norms"]["in"].shape == (cfg.num_layers + 1, cfg.hidden_size) and "norm" not in params
    for params in (plain.tparams, plain.dparams):
        assert "norms" not in params and all("attn_norm" in p and "mlp_norm" in p for p in params["layers"])


@pytest.mark.parametrize("norm_impl, matmul_impl, stacked", [
    ("xla", "xla", False), ("pallas_interpret", "xla", True), ("xla", "pallas_interpret", True),
    ("auto", "auto", None), ("xla", "auto", None)])
def test_norms_are_stacked_where_kernels_read_them(norm_impl, matmul_impl, stacked):
    """Stacked where a kernel reads the norm weights; "auto" takes kernels on NVIDIA GPUs only."""
    from ddtree_jax.models.layers import stacks_norms_for
    from ddtree_jax.tuning import CPU_KERNELS, GPU_KERNELS

    for kernels, on_gpu in ((CPU_KERNELS, False), (GPU_KERNELS, True)):
        want = on_gpu if stacked is None else stacked
        assert stacks_norms_for(kernels.with_impls(norms=norm_impl, matmul=matmul_impl)) is want


@pytest.mark.parametrize("method", ["ar", "ddtree"])
def test_a_conversation_continues_in_its_cache(pair, method):
    """A later turn appended to the last request's caches (generate_ids(start=...)) gives the
    tokens a fresh request over the whole conversation gives, also where the first turn was cut
    by max_new_tokens mid-round (its cache then holds positions beyond what was kept), and where
    the turn rewinds into the earlier reply (a start before its end)."""
    gen = Generator(pair, executables=SHARED, method=method, budget=16)
    fresh = Generator(pair, executables=SHARED, method=method, budget=16)
    first = list(range(2, 12))
    kw = dict(max_new_tokens=9, min_cache=256)
    reply = gen.generate_ids([first], **kw)[0].token_ids
    convo = first + reply
    for extra, back in (([7, 8, 9], 0), ([4, 4], 0), ([5, 6], 3)):
        start = len(convo) - 1 - back           # everything but the last token is in the cache
        convo = convo[: len(convo) - back] + extra
        got = gen.generate_ids([convo[start:]], start=start, **kw)[0].token_ids
        want = fresh.generate_ids([convo], max_new_tokens=9)[0].token_ids
        assert got == want, (extra, back)
        convo += got
    from ddtree_jax.errors import UserError

    with pytest.raises(UserError, match="no longer fits"):
        gen.generate_ids([convo[-1:]], start=len(convo) + 300, **kw)


@pytest.mark.parametrize("dtype, want", [(jnp.float32, "HIGHEST, HIGHEST"), (jnp.bfloat16, "DEFAULT, DEFAULT")])
def test_float32_products_run_at_full_precision(dtype, want):
    """Every product of a float32 model's round and prefill asks for full float32 precision (JAX's
    default on NVIDIA GPUs is TF32); bf16 keeps the default."""
    import re

    pair = tiny_pair()
    pair.target_params = jax.tree_util.tree_map(lambda x: x.astype(dtype), pair.target_params)
    pair.drafter_params = jax.tree_util.tree_map(lambda x: x.astype(dtype), pair.drafter_params)
    gen = Generator(pair, method="ddtree", budget=8)
    spec = gen.spec_for(8, 16, SamplingConfig(), batch=1)
    static = dict(tcfg=gen.tcfg, dcfg=gen.dcfg, spec=spec)
    args = (jnp.ones((1, 8), jnp.int32), jnp.full((1,), 8, jnp.int32), jnp.full((1,), 16, jnp.int32),
            engine.make_knobs(0.0, 1.0), jax.random.PRNGKey(0))
    state = engine.state_shapes(gen.tparams, gen.dparams, *args, **static)
    for text in (engine.run_rounds.lower(gen.tparams, gen.dparams, state, args[3], jnp.int32(2), **static).as_text(),
                 engine.prefill_into.lower(state, gen.tparams, gen.dparams, *args, **static).as_text()):
        dots = re.findall(r"stablehlo.dot_general[^\n]*", text)
        assert len(dots) > 10
        assert {m.group(1) for m in (re.search(r"precision = \[([A-Z, ]+)\]", d) for d in dots) if m} == {want}
