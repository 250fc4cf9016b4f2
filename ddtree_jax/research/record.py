"""Recording: the target's greedy continuation of each prompt and the drafter's block log-probs
at every root position of it, enough to replay any tree policy's greedy rounds without the models.

What is recorded for a prompt of L tokens and N new tokens (`max_new_tokens`):
  * `outputs [N + D]`: the greedy continuation (D = the drafter's depth). The engine's last round
    may accept draft tokens past the N-th, so D more are kept to score it; replay never emits them.
  * `logp, ids [N - 1, D, K]`: for the round rooted at output j (position L + j, j < N - 1), the
    drafter's log-probs per depth as `engine.draft_stage` computes them, cut to the top K tokens
    in `lax.top_k`'s order (value desc, then lower token id): the order the policies rank by.

How: one prefill over prompt + outputs (`engine.prefill`) gives the target's taps and, from
them, the drafter's cache of context K/V for every position at once; a causal pass computes each
position's taps from the positions before it, which is what the accepted paths of the engine's
verify passes compute. A round rooted at position p sees the cache's first p positions, so the
draft stage runs on a batch of roots at once over copies of one cache, each with its own length
(the stage's positions, sliding windows and mask follow from the length, as in the engine).

The file: `store.py`.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ddtree_jax import engine
from ddtree_jax.kernels.chunk_topk import top_k_total_order
from ddtree_jax.models.layers import KVCache
from ddtree_jax.research.store import FORMAT, fingerprint
from ddtree_jax.sampling import SamplingConfig

# Device bytes the copies of the drafter cache that one draft call reads may take.
DRAFT_CACHE_BYTES = 256 << 20


def progress(total: int, desc: str, unit: str):
    """A progress bar on stderr where a person watches it (a terminal)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False)


def record_greedy(gen, prompts: Sequence[Sequence[int]], max_new_tokens: int, top_k: int, *,
                  batch_size: int = 8, roots_per_call: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(outputs [P, N + D], logp [P, N - 1, D, K], ids [P, N - 1, D, K]) for tokenised prompts.

    gen: a `Generator` with a DFlash drafter (method "ddtree"): it decodes the greedy
    continuations (lossless: the target's own), and its params, kernel choices and tuning are the
    ones the drafts run with. roots_per_call: roots a draft call takes (0: as many as
    DRAFT_CACHE_BYTES of drafter cache copies allow, at most 64)."""
    depth = gen.dcfg.depth
    outputs = np.zeros((len(prompts), max_new_tokens + depth), np.int32)
    with progress(len(prompts), "greedy", "prompt") as bar:
        for start in range(0, len(prompts), batch_size):
            batch = [list(p) for p in prompts[start:start + batch_size]]
            # no stop ids: the continuation past an eos is kept, so that replay may stop there or not
            for i, res in enumerate(gen.generate_ids(batch, max_new_tokens=max_new_tokens + depth)):
                outputs[start + i] = res.token_ids
            bar.update(len(batch))
    roots = max_new_tokens - 1
    id_dtype = np.uint16 if gen.tcfg.vocab_size <= 1 << 16 else np.int32  # a third less file
    logp = np.zeros((len(prompts), roots, depth, top_k), np.float32)
    ids = np.zeros((len(prompts), roots, depth, top_k), id_dtype)
    with progress(len(prompts) * roots, "drafts", "root") as bar:
        for start in range(0, len(prompts), batch_size):
            batch = range(start, min(start + batch_size, len(prompts)))
            seqs = [np.concatenate([np.asarray(prompts[b], np.int32), outputs[b]]) for b in batch]
            blocks = _draft_blocks(gen, seqs, [len(prompts[b]) for b in batch], roots, top_k, roots_per_call, bar)
            for b, (lp, tok) in zip(batch, blocks):
                logp[b], ids[b] = lp, tok
    return outputs, logp, ids


def _draft_blocks(gen, seqs: list[np.ndarray], prompt_lens: list[int], roots: int, top_k: int, roots_per_call: int,
                  bar) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per sequence, the top-k drafts of the rounds rooted at its positions L .. L + roots - 1."""
    longest = max(len(s) for s in seqs)
    tokens = np.zeros((len(seqs), longest), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)] = s
    # the Generator's kernel choices and tuning, with caches just long enough for the sequences
    spec = dataclasses.replace(gen.spec_for(longest, 1, SamplingConfig()), cache_size=-(-longest // 128) * 128)
    pre = engine.prefill_spec(spec)
    cache, dcache = engine.new_caches(gen.tcfg, gen.dcfg, pre, len(seqs), gen.tparams["embed"].dtype)
    lens, max_new = np.asarray([len(s) for s in seqs], np.int32), np.ones(len(seqs), np.int32)
    state = engine.prefill(gen.tparams, gen.dparams, cache, dcache, *jax.device_put((tokens, lens, max_new)),
                           engine.make_knobs(), jax.random.PRNGKey(0), tcfg=gen.tcfg, dcfg=gen.dcfg, spec=pre)
    state = dataclasses.replace(state, cache=None)  # only the drafter's cache is read from here on
    rows = np.repeat(np.arange(len(seqs), dtype=np.int32), roots)
    pos = np.concatenate([np.arange(n, n + roots, dtype=np.int32) for n in prompt_lens])
    per_root = 2 * state.dcache.k.nbytes // len(seqs)
    chunk = roots_per_call or int(max(1, min(64, DRAFT_CACHE_BYTES // per_root)))
    logp = np.zeros((len(rows), gen.dcfg.depth, top_k), np.float32)
    ids = np.zeros((len(rows), gen.dcfg.depth, top_k), np.int32)
    for lo in range(0, len(rows), chunk):
        take = np.arange(lo, lo + chunk).clip(max=len(rows) - 1)  # the last call padded: one shape
        lp, tok = _draft_top_k(gen.tparams, gen.dparams, state, *jax.device_put((rows[take], pos[take],
                                                                                tokens[rows[take], pos[take]])),
                               tcfg=gen.tcfg, dcfg=gen.dcfg, spec=spec, top_k=top_k)
        n = min(chunk, len(rows) - lo)
        logp[lo:lo + n], ids[lo:lo + n] = np.asarray(lp)[:n], np.asarray(tok)[:n]
        bar.update(n)
    for i in range(len(seqs)):
        yield logp[i * roots:(i + 1) * roots], ids[i * roots:(i + 1) * roots]


@functools.partial(jax.jit, static_argnames=("tcfg", "dcfg", "spec", "top_k"))
def _draft_top_k(tparams, dparams, state: engine.State, rows, length, root, *, tcfg, dcfg, spec, top_k: int):
    """The draft stage of rounds rooted at tokens `root` at positions `length` of sequences `rows`
    (rows of state.dcache): the top_k log-probs and token ids per depth [R, D, K]."""
    dcache = KVCache(jnp.take(state.dcache.k, rows, axis=1), jnp.take(state.dcache.v, rows, axis=1))
    state = dataclasses.replace(state, dcache=dcache, length=length, root=root)
    logp = engine.draft_stage(tparams, dparams, state, tcfg=tcfg, dcfg=dcfg, spec=spec)
    return top_k_total_order(logp, top_k)


def make_header(*, ckpt_dir: Path, gen, top_k: int, max_new_tokens: int, stop_ids: Sequence[int],
                sources: Sequence[str]) -> dict:
    """The record's JSON header: what it was made from and with."""
    return {
        "format": FORMAT,
        "checkpoint": {"path": str(ckpt_dir), "fingerprint": fingerprint(ckpt_dir)},
        "dtype": str(gen.tparams["embed"].dtype),
        "device": jax.devices()[0].device_kind,
        "block_size": gen.dcfg.block_size,
        "depth": gen.dcfg.depth,
        "vocab_size": gen.tcfg.vocab_size,
        "top_k": top_k,
        "max_new_tokens": max_new_tokens,
        "stop_ids": [int(t) for t in stop_ids],
        "sources": list(sources),
    }
