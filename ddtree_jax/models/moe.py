"""The mixture-of-experts MLP of Qwen3-MoE and Qwen2-MoE targets, as transformers computes it.

Params of an MoE layer (weight matrices [in, out]):
    "router" [H, E]; "experts_gate" [E, H, Ie], "experts_up" [E, H, Ie] (the inference layout:
    "experts_gate_up" [E, H, 2 Ie], gate then up), "experts_down" [E, Ie, H]; with a shared expert
    (Qwen2-MoE) "shared_gate" [H, Is], "shared_up" [H, Is] (or "shared_gate_up"), "shared_down"
    [Is, H] and "shared_expert_gate" [H, 1].

Routing (Qwen3MoeTopKRouter): logits x @ router in the hidden dtype, softmax in float32, the top
k, renormalised over the k where norm_topk_prob, cast to the hidden dtype. Each token's output is
the routing-weighted sum of its k experts' swiglu MLPs, plus sigmoid(x @ shared_expert_gate) times
the shared expert's MLP where there is one.

The experts run as two grouped products (`jax.lax.ragged_dot`): the N*k (token, expert)
assignments sorted by expert, each expert's rows multiplied by its weights alone, so a pass does
k MLPs of work a token, whatever N is (decode, a verify's tree, a prefill chunk). Static shapes
throughout: group sizes are data, not shapes. Where a device runs that slower than the
alternatives (XLA's GPU lowering), the tuning picks another impl (`experts`, dispatch.moe_choice:
"grouped" on one GPU, "dense" and "gather" under --tp): the same values.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ddtree_jax.kernels import dispatch
from ddtree_jax.models.config import MoeConfig
from ddtree_jax.models.layers import mlp
from ddtree_jax.tuning import XLA_KERNELS, KernelTuning

__all__ = ["route", "experts", "block", "expert_counts", "distinct_experts"]


def route(p: dict, x: jax.Array, moe: MoeConfig, kernels: KernelTuning = XLA_KERNELS) -> tuple[jax.Array, jax.Array]:
    """(weights [N, k] in x's dtype, experts int32 [N, k]) of tokens x [N, H], as transformers'
    router: its ties go to the lower expert index (lax.top_k), which torch.topk does not promise.
    kernels: in the deterministic mode the product and the softmax's sum run in an order that
    does not depend on N."""
    if kernels.deterministic:
        logits = dispatch.matmul(kernels, x, p["router"]).astype(jnp.float32)
        e = jnp.exp(logits - logits.max(axis=-1, keepdims=True))
        probs = e / dispatch.row_sum(kernels, e)[..., None]
    else:
        logits = jnp.dot(x, p["router"].astype(x.dtype)).astype(jnp.float32)  # the product in x's dtype, as F.linear
        probs = jax.nn.softmax(logits, axis=-1)
    top, idx = jax.lax.top_k(probs, moe.top_k)
    if moe.norm_topk_prob:
        top = top / dispatch.row_sum(kernels, top)[..., None]
    return top.astype(x.dtype), idx.astype(jnp.int32)


def expert_counts(idx: jax.Array, num_experts: int) -> jax.Array:
    """int32 [E]: how many of the (token, expert) assignments idx [..., k] went to each expert."""
    return jnp.zeros((num_experts,), jnp.int32).at[idx.reshape(-1)].add(1)


def distinct_experts(counts: jax.Array) -> jax.Array:
    """int32 [...]: the experts with at least one assignment, from counts [..., E] (a forward's
    moe_stats: per layer the experts whose weights the pass read)."""
    return jnp.sum(counts > 0, axis=-1, dtype=jnp.int32)


def _gate_up(p: dict) -> jax.Array:
    if "experts_gate_up" in p:
        return p["experts_gate_up"]
    return jnp.concatenate([p["experts_gate"], p["experts_up"]], axis=-1)  # unfused params (tests, training)


# "dense" runs over at most this many tokens at once: its [E, tokens, 2 Ie] activations stay < 0.5 GB
# for Qwen3-30B-A3B's shape (a batch of 1024-token prefill pieces runs as several)
DENSE_CHUNK = 1024


def experts(p: dict, x: jax.Array, weights: jax.Array, idx: jax.Array, impl: str = "ragged",
            kernels: KernelTuning = XLA_KERNELS) -> jax.Array:
    """sum_j weights[n, j] * expert_{idx[n, j]}(x[n]) for x [N, H]. impl (the same values every way,
    up to rounding): "ragged": the assignments sorted by expert, two ragged_dots over the sorted
    rows, back to token order; "dense": every expert over every token, the unchosen weighted 0 (no
    sort; E/k times the work, which on GPUs beat XLA's ragged_dot: tuning.GPU_KERNELS); "gather":
    each token's k experts' weights gathered (a few tokens: only the chosen experts are read);
    "deterministic" (`kernels` in that mode) or "grouped" (outside it; the Pallas matmul kernel):
    the (token, expert) rows grouped by expert into the deterministic product's row tiles
    (dispatch.expert_rows), each touched expert's weights read once a tile, a row's output its
    one-row product's."""
    n, k = idx.shape
    gate_up = _gate_up(p).astype(x.dtype)
    down = p["experts_down"].astype(x.dtype)
    num_experts, _, width = gate_up.shape
    swiglu = lambda gu: jax.nn.silu(gu[..., : width // 2]) * gu[..., width // 2:]
    if impl == "dense":
        def dense(args):
            xc, wc, ic = args
            act = swiglu(jnp.einsum("nh,ehi->eni", xc, gate_up))
            # routing weights over all experts, 0 where not chosen: one product over (expert, Ie)
            comb = jnp.zeros((num_experts, xc.shape[0]), x.dtype).at[ic.T, jnp.arange(xc.shape[0])].set(wc.T)
            return jnp.einsum("eni,eih->nh", act * comb[..., None], down,
                              preferred_element_type=jnp.float32).astype(x.dtype)
        if n <= DENSE_CHUNK:
            return dense((x, weights, idx))
        pad = -n % DENSE_CHUNK
        chunks = [jnp.pad(a, ((0, pad),) + ((0, 0),) * (a.ndim - 1)) for a in (x, weights, idx)]
        chunks = [a.reshape(-1, DENSE_CHUNK, *a.shape[1:]) for a in chunks]
        return jax.lax.map(dense, tuple(chunks)).reshape(-1, x.shape[-1])[:n]
    if impl == "gather":
        act = swiglu(jnp.einsum("nh,nkhi->nki", x, gate_up[idx]))
        out = jnp.einsum("nki,nkih->nkh", act, down[idx], preferred_element_type=jnp.float32)
    elif impl in ("deterministic", "grouped"):  # grouped: the same kernel outside the deterministic mode
        if n == 1:  # one token's k experts are distinct: a row tile each, in top-k order, no grouping
            tile, groups = dispatch.EXPERT_ROW_TILE, idx[0]
            rows = jnp.pad(jnp.broadcast_to(x[:, None], (k, 1, x.shape[-1])), ((0, 0), (0, tile - 1), (0, 0)))
            rows = rows.reshape(k * tile, -1)
        else:
            dest, groups, tile = dispatch.expert_rows(kernels, idx.reshape(-1), num_experts)
            rows = jnp.zeros((groups.shape[0] * tile, x.shape[-1]), x.dtype).at[dest].set(jnp.repeat(x, k, axis=0))
        act = dispatch.expert_matmul(kernels, rows, gate_up, groups)
        out = dispatch.expert_matmul(kernels, act, down, groups, prologue="swiglu")
        out = out.reshape(k, tile, -1)[None, :, 0] if n == 1 else out[dest].reshape(n, k, -1)
        out = out.astype(jnp.float32) * weights.astype(jnp.float32)[..., None]
        total = out[:, 0]
        for j in range(1, k):   # the top-k order, term by term
            total = total + out[:, j]
        return total.astype(x.dtype)
    elif impl == "ragged":
        flat = idx.reshape(-1)
        # stable: within an expert, rows keep token order (deterministic, whatever the sort)
        order = jnp.argsort(flat, stable=True)
        sizes = expert_counts(flat, num_experts)
        act = swiglu(jax.lax.ragged_dot(x[order // k], gate_up, sizes))   # rows grouped by expert
        out = jax.lax.ragged_dot(act, down, sizes, preferred_element_type=jnp.float32)
        # back to [N, k] order by the inverse permutation (a gather: no scatter-add races)
        inverse = jnp.zeros_like(order).at[order].set(jnp.arange(n * k, dtype=order.dtype))
        out = out[inverse].reshape(n, k, -1)
    else:
        raise ValueError(f"unknown MoE experts impl {impl!r}; choose ragged, dense, gather or grouped")
    # each expert's output rounded to x's dtype and scaled by the rounded weight, as transformers;
    # the k terms summed in float32, in a fixed order (the top-k order), so a token's sum does not
    # depend on what else is in the pass
    out = out.astype(x.dtype).astype(jnp.float32) * weights.astype(jnp.float32)[..., None]
    return jnp.sum(out, axis=1).astype(x.dtype)


def _shared(p: dict, x: jax.Array, kernels: KernelTuning) -> jax.Array:
    if "shared_gate_up" in p:
        mp = {"gate_up": p["shared_gate_up"], "down": p["shared_down"]}
    else:
        mp = {"gate": p["shared_gate"], "up": p["shared_up"], "down": p["shared_down"]}
    if kernels.deterministic:
        gate = jax.nn.sigmoid(dispatch.matmul(kernels, x, p["shared_expert_gate"]))
    else:
        gate = jax.nn.sigmoid(jnp.dot(x, p["shared_expert_gate"].astype(x.dtype)))
    return gate * mlp(mp, x, kernels=kernels)


def block(p: dict, x: jax.Array, moe: MoeConfig, *, kernels: KernelTuning = XLA_KERNELS,
          counts: bool = False):
    """The MoE block's output for x [..., H] (any leading shape: [Bt, T]); with counts=True also
    int32 [E], the assignments each expert got (expert_counts): how many experts the pass read."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    weights, idx = route(p, x2, moe, kernels)
    out = experts(p, x2, weights, idx, dispatch.moe_choice(kernels, x2.shape[0]), kernels)
    if "shared_down" in p:
        out = out + _shared(p, x2, kernels)
    out = out.reshape(*lead, -1)
    return (out, expert_counts(idx, moe.num_experts)) if counts else out
