"""Gated DeltaNet's recurrence over a tree of tokens, node by node: the deterministic mode's
linear-attention core (ddtree_jax.models.gdn, KernelTuning.deterministic).

The layer's default verify runs the parallel form (a triangular solve over the tree), whose sums
are not the one-token recurrence's: a verify row would not be bit for bit its decode step. Here
every node is one step of the recurrence from its parent's state (the pre-round state for a
root), through one code path whatever the number of nodes, so that a decode step (one node), a
tree verify (N nodes) and the commit of an accepted path (a chain) compute the same bits for
the same token:

    k = l2norm(k);  q = l2norm(q) / sqrt(dk)
    S = S_parent * exp(g);  S += k ((v - k^T S) beta)^T;  o = q^T S

A program holds one (batch row, value head, block of value columns): the columns of S evolve
independently (each column's update reads only that column), so a [dk, block_v] tile of S is a
program's whole state, and its reductions over dk run over one tile shape for every call.
Every node's state is written to `states` [Bt, Hv, N, dk, dv] float32, which a child reads back
(a barrier orders the write before the read across the program's threads) and the commit
gathers its accepted node from. Memory: N dk dv float32 a value head and row, transient within
a layer's verify.

Backend: Pallas with the Triton lowering, interpret mode on the CPU (as the other deterministic
kernels). What it cannot take (`unsupported`): dk or dv that is not a power of two.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from .tree_attention import _compiler_params, pltriton

__all__ = ["recurrence", "unsupported", "BLOCK_V"]

BLOCK_V = 32        # value columns a program: a [128, 32] f32 tile is 32 registers a thread at 4 warps
_NUM_WARPS = 4
_L2_EPS = 1e-6      # transformers' l2norm eps (models.gdn's)


def unsupported(dk: int, dv: int) -> str | None:
    for name, n in (("key head dim", dk), ("value head dim", dv)):
        if n < 1 or n & (n - 1):
            return f"the {name} {n} is not a power of two"
    return None


def _kernel(*refs, n: int, scale: float, outputs: bool, interpret: bool):
    """One (batch row, value head, column block). Refs: parents [N]; q (if `outputs`), k [N, dk]
    (the key head of this value head); v [N, BV]; g, beta [N]; s0 [dk, BV]; out o [N, BV] (if
    `outputs`), states [N, dk, BV]."""
    if outputs:
        par_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, s0_ref, o_ref, states_ref = refs
    else:
        par_ref, k_ref, v_ref, g_ref, beta_ref, s0_ref, states_ref = refs
    s0 = s0_ref[...]

    def l2norm(x):
        return x * lax.rsqrt(jnp.sum(x * x) + _L2_EPS)

    def node(i, carry):
        p = par_ref[i]
        # a parent's state as this program wrote it (a root starts from the pre-round state)
        parent = states_ref[jnp.maximum(p, 0)]
        s = jnp.where(p >= 0, parent, s0) * jnp.exp(g_ref[i])
        k = l2norm(k_ref[i].astype(jnp.float32))
        kv = jnp.sum(k[:, None] * s, axis=0)
        delta = (v_ref[i].astype(jnp.float32) - kv) * beta_ref[i]
        s = s + k[:, None] * delta[None, :]
        if outputs:
            q = l2norm(q_ref[i].astype(jnp.float32)) * scale
            o_ref[i] = jnp.sum(q[:, None] * s, axis=0)
        states_ref[i] = s
        if not interpret:  # every thread's part of node i's state stored before a child loads it
            pltriton.debug_barrier()
        return carry

    lax.fori_loop(0, n, node, 0)


def recurrence(q, k, v, g, beta, parents, s0, *, interpret: bool = False):
    """The recurrence over a tree of N nodes a row (module doc).

    q, k [Bt, N, Hk, dk]: the conv's query and key outputs, not yet normalised (any float dtype;
    q None: states only, o is None);
    v [Bt, N, Hv, dv]; g (log decay), beta [Bt, N, Hv] float32; parents int32 [Bt, N]: a node's
    parent, which comes before it, or -1 for a node that starts from s0 (a decode step is one
    node; a chain's node i has parent i - 1); s0 [Bt, Hv, dk, dv] float32, the pre-round state.
    Value head h reads key head h // (Hv / Hk). Returns o [Bt, N, Hv, dv] float32 (q^T S of each
    node) and states [Bt, Hv, N, dk, dv] float32 (every node's state).
    """
    bt, n, hk, dk = k.shape
    outputs = q is not None
    hv, dv = v.shape[2], v.shape[3]
    why = unsupported(dk, dv)
    if why:
        raise ValueError(f"the deterministic Gated DeltaNet kernel cannot take these shapes: {why}")
    if (outputs and q.shape != k.shape) or v.shape[:2] != (bt, n) or g.shape != (bt, n, hv) \
            or beta.shape != g.shape or parents.shape != (bt, n) or s0.shape != (bt, hv, dk, dv) or hv % hk:
        raise ValueError(f"mismatched shapes: q {None if q is None else q.shape}, k {k.shape}, v {v.shape}, "
                         f"g {g.shape}, beta {beta.shape}, parents {parents.shape}, s0 {s0.shape}")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); "
                           "the deterministic mode needs it")
    group, bv = hv // hk, min(BLOCK_V, dv)
    kernel = functools.partial(_kernel, n=n, scale=dk ** -0.5, outputs=outputs, interpret=interpret)
    key_rows = pl.BlockSpec((None, n, None, dk), lambda b, h, j: (b, 0, h // group, 0))
    columns = pl.BlockSpec((None, n, None, bv), lambda b, h, j: (b, 0, h, j))
    per_node = pl.BlockSpec((None, n, None), lambda b, h, j: (b, 0, h))
    state = pl.BlockSpec((None, None, dk, bv), lambda b, h, j: (b, h, 0, j))
    states = (pl.BlockSpec((None, None, n, dk, bv), lambda b, h, j: (b, h, 0, 0, j)),
              jax.ShapeDtypeStruct((bt, hv, n, dk, dv), jnp.float32))
    o = (columns, jax.ShapeDtypeStruct((bt, n, hv, dv), jnp.float32))
    outs = [o, states] if outputs else [states]
    res = pl.pallas_call(
        kernel,
        grid=(bt, hv, dv // bv),
        in_specs=[pl.BlockSpec((None, n), lambda b, h, j: (b, 0))] + [key_rows] * (1 + outputs)
                 + [columns, per_node, per_node, state],
        out_specs=[spec for spec, _ in outs],
        out_shape=[shape for _, shape in outs],
        compiler_params=_compiler_params(_NUM_WARPS, 1, interpret),
        interpret=interpret,
        name="ddtree_gdn_recurrence",
    )(parents.astype(jnp.int32), *([q] if outputs else []), k, v, g.astype(jnp.float32),
      beta.astype(jnp.float32), s0.astype(jnp.float32))
    return tuple(res) if outputs else (None, res[0])
