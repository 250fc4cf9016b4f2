"""Gated DeltaNet's recurrence over a tree of tokens, node by node: the deterministic mode's
linear-attention core (ddtree_jax.models.gdn, KernelTuning.deterministic), and the tree verify
of KernelTuning.gdn_tree "recurrent".

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
The nodes are visited in a depth-first preorder (`order`), so that a node's parent is the last
node visited one level up: a node's state goes to the slot of its depth in `states` [Bt, Hv, N,
dk, dv] float32, where its children read it back (a barrier orders the write before the read
across the program's threads); where a node comes right after its parent (a chain's every
node), the parent's state is still in registers and is not loaded. A chain's slot d is its node
d's state, which the commit reads. A tree's N states go to its depth + 1 slots, not to N of
their own: the traffic stays in L2.

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

__all__ = ["recurrence", "preorder", "unsupported", "BLOCK_V"]

BLOCK_V = 32        # value columns a program: a [128, 32] f32 tile is 32 registers a thread at 4 warps
_NUM_WARPS = 4
_L2_EPS = 1e-6      # transformers' l2norm eps (models.gdn's)


def unsupported(dk: int, dv: int) -> str | None:
    for name, n in (("key head dim", dk), ("value head dim", dv)):
        if n < 1 or n & (n - 1):
            return f"the {name} {n} is not a power of two"
    return None


def _kernel(*refs, n: int, scale: float, outputs: bool, interpret: bool):
    """One (batch row, value head, column block). Refs: order, depth [N]; q (if `outputs`), k [N, dk]
    (the key head of this value head); v [N, BV]; g, beta [N]; s0 [dk, BV]; out o [N, BV] (if
    `outputs`), states [N, dk, BV] (a slot a depth)."""
    if outputs:
        order_ref, depth_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, s0_ref, o_ref, states_ref = refs
    else:
        order_ref, depth_ref, k_ref, v_ref, g_ref, beta_ref, s0_ref, states_ref = refs
    s0 = s0_ref[...]

    def l2norm(x):
        return x * lax.rsqrt(jnp.sum(x * x) + _L2_EPS)

    def node(j, carry):
        s_prev, d_prev = carry
        i = order_ref[j]
        d = depth_ref[i]
        # the parent's state: the previous node's, still in registers, where that was the parent
        # (in a preorder, wherever d follows d - 1), else as this program stored it; a root's the
        # pre-round state
        chained = d == d_prev + 1
        load = jnp.broadcast_to(~chained & (d > 0), s0.shape)
        stored = pltriton.load(states_ref.at[jnp.maximum(d - 1, 0)], mask=load, other=0.0)
        s = jnp.where(chained, s_prev, jnp.where(d > 0, stored, s0)) * jnp.exp(g_ref[i])
        k = l2norm(k_ref[i].astype(jnp.float32))
        kv = jnp.sum(k[:, None] * s, axis=0)
        delta = (v_ref[i].astype(jnp.float32) - kv) * beta_ref[i]
        s = s + k[:, None] * delta[None, :]
        if outputs:
            q = l2norm(q_ref[i].astype(jnp.float32)) * scale
            o_ref[i] = jnp.sum(q[:, None] * s, axis=0)
        states_ref[d] = s
        if not interpret:  # every thread's part of node i's state stored before a child loads it
            pltriton.debug_barrier()
        return s, d

    lax.fori_loop(0, n, node, (s0, jnp.int32(-1)))    # the first node, a root, "follows" depth -1: s0


def preorder(parents: jax.Array, ancestor_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(order, depth) int32 [Bt, N] of trees given by parents int32 [Bt, N] (the root's -1, every
    parent before its children) and ancestor_mask bool [Bt, N, N] ([b, i, j]: j is i or an
    ancestor of i): the nodes in depth-first preorder, siblings by index, and each node's depth.
    Node j's place: its ancestors, plus the subtrees of the smaller siblings of j and of each of
    its ancestors ([N, N] arrays, no sort)."""
    n = parents.shape[-1]
    ids = jnp.arange(n, dtype=jnp.int32)
    depth = ancestor_mask.sum(axis=-1, dtype=jnp.int32) - 1
    size = ancestor_mask.sum(axis=-2, dtype=jnp.int32)                            # each node's subtree
    smaller_sibling = (parents[..., None, :] == parents[..., :, None]) & (ids < ids[:, None])    # [b, a, s]
    left = jnp.sum(jnp.where(smaller_sibling, size[..., None, :], 0), axis=-1)     # [b, a]
    rank = depth + jnp.sum(jnp.where(ancestor_mask, left[..., None, :], 0), axis=-1)
    order = jax.vmap(lambda r: jnp.zeros((n,), jnp.int32).at[r].set(ids))(rank.reshape(-1, n)).reshape(rank.shape)
    return order, depth


def recurrence(q, k, v, g, beta, order, depth, s0, *, interpret: bool = False):
    """The recurrence over a tree of N nodes a row (module doc).

    q, k [Bt, N, Hk, dk]: the conv's query and key outputs, not yet normalised (any float dtype;
    q None: states only, o is None);
    v [Bt, N, Hv, dv]; g (log decay), beta [Bt, N, Hv] float32; order int32 [Bt, N]: the nodes
    in a depth-first preorder (`preorder`); depth int32 [Bt, N]: a node's depth, 0 for a node
    that starts from s0 (a decode step is one node; a chain's node i is at depth i); s0 [Bt,
    Hv, dk, dv] float32, the pre-round state. Value head h reads key head h // (Hv / Hk). Returns
    o [Bt, N, Hv, dv] float32 (q^T S of each node) and states [Bt, Hv, N, dk, dv] float32 (slot d:
    the state of the last node visited at depth d).
    """
    bt, n, hk, dk = k.shape
    outputs = q is not None
    hv, dv = v.shape[2], v.shape[3]
    why = unsupported(dk, dv)
    if why:
        raise ValueError(f"the Gated DeltaNet recurrence kernel cannot take these shapes: {why}")
    if (outputs and q.shape != k.shape) or v.shape[:2] != (bt, n) or g.shape != (bt, n, hv) \
            or beta.shape != g.shape or order.shape != (bt, n) or depth.shape != (bt, n) \
            or s0.shape != (bt, hv, dk, dv) or hv % hk:
        raise ValueError(f"mismatched shapes: q {None if q is None else q.shape}, k {k.shape}, v {v.shape}, "
                         f"g {g.shape}, beta {beta.shape}, order {order.shape}, depth {depth.shape}, s0 {s0.shape}")
    if pltriton is None:
        raise RuntimeError("this jax has no Pallas Triton module (jax.experimental.pallas.triton); "
                           "the deterministic mode and gdn_tree 'recurrent' need it")
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
        in_specs=[pl.BlockSpec((None, n), lambda b, h, j: (b, 0))] * 2 + [key_rows] * (1 + outputs)
                 + [columns, per_node, per_node, state],
        out_specs=[spec for spec, _ in outs],
        out_shape=[shape for _, shape in outs],
        compiler_params=_compiler_params(_NUM_WARPS, 1, interpret),
        interpret=interpret,
        name="ddtree_gdn_recurrence",
    )(order.astype(jnp.int32), depth.astype(jnp.int32), *([q] if outputs else []), k, v, g.astype(jnp.float32),
      beta.astype(jnp.float32), s0.astype(jnp.float32))
    return tuple(res) if outputs else (None, res[0])
