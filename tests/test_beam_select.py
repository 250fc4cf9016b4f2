"""The one-kernel depth loop (ddtree_jax/kernels/beam_select.py) in interpret mode: the same trees
as XLA's depth loop for every policy that uses it (ties, -inf log-probs, tiny vocabularies,
batch > 1), its settings gate, and its Triton module lowers for CUDA and verifies."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax.trees import ddtree, make_policy
from ddtree_jax.kernels.beam_select import beam_select, make_plan
from test_kernels import _verified_triton_modules


def _logp(seed, batch, depth, vocab, kind):
    x = 3.0 * jax.random.normal(jax.random.PRNGKey(seed), (batch, depth, vocab))
    logp = jax.nn.log_softmax(x, -1)
    if kind == "ties":
        logp = jnp.round(logp * 2) / 2          # many equal scores: the key decides
    elif kind == "neginf":
        logp = logp.at[..., ::3].set(-jnp.inf)  # masked tokens reach the top-K of small vocabularies
    return logp


def _trees_equal(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("policy,budget,batch,depth,vocab,kind", [
    ("ddtree", 16, 1, 15, 2048, "float"),
    ("ddtree", 16, 2, 15, 2048, "ties"),
    ("ddtree", 40, 1, 6, 50, "neginf"),        # 33 finite tokens: -inf inside the top 40
    ("ddtree", 7, 1, 6, 5, "float"),           # tiny vocabulary: padded invalid slots
    ("ddtree", 2, 3, 4, 100, "ties"),
    ("beam", 24, 2, 7, 500, "ties"),           # width 4 < budget: the beam's own bounds
])
def test_beam_kernel_builds_the_xla_tree(monkeypatch, policy, budget, batch, depth, vocab, kind):
    logp = _logp(budget * 7 + depth, batch, depth, vocab, kind)
    pol = make_policy(policy)
    backend = jax.default_backend()
    monkeypatch.setitem(ddtree.BEAM_KERNEL_MAX, backend, 0)
    want = pol.build(logp, budget)
    monkeypatch.setitem(ddtree.BEAM_KERNEL_MAX, backend, 10_000)
    calls = []
    real = ddtree.beam_select
    monkeypatch.setattr(ddtree, "beam_select", lambda *a, **k: calls.append(k) or real(*a, **k))
    _trees_equal(pol.build(logp, budget), want)
    assert calls == [dict(interpret=backend != "gpu")]     # the kernel built it


def test_beam_kernel_gate():
    """The kernel runs where the setting covers every depth's candidate count, else XLA's ops."""
    plan = ddtree._depth_plan(16, 16, 16, 16, 15)      # 34 candidates at depth 2
    most = max(len(p) for _, p, _ in plan)
    backend = jax.default_backend()
    saved = dict(ddtree.BEAM_KERNEL_MAX)
    try:
        ddtree.BEAM_KERNEL_MAX[backend] = most - 1
        assert ddtree._beam_impl(plan) == "xla"
        ddtree.BEAM_KERNEL_MAX[backend] = most
        assert ddtree._beam_impl(plan) != "xla"
        assert ddtree._beam_impl([]) == "xla"             # depth 1 only: nothing to select
    finally:
        ddtree.BEAM_KERNEL_MAX.clear()
        ddtree.BEAM_KERNEL_MAX.update(saved)


def test_beam_kernel_triton_lowering_verifies(monkeypatch):
    """B = 64's plan (216 candidates at depth 2, 14 depths) lowers for CUDA, on a CPU machine."""
    modules = _verified_triton_modules(monkeypatch)
    plan = make_plan(64, ddtree._depth_plan(64, 64, 64, 64, 15))
    fn = lambda v, t: beam_select(v, t, plan)
    try:
        jax.jit(fn).trace(jax.ShapeDtypeStruct((1, 15, 64), jnp.float32),
                          jax.ShapeDtypeStruct((1, 15, 64), jnp.int32)).lower(lowering_platforms=("cuda",))
    except RuntimeError as e:  # pragma: no cover - depends on the installed jax
        pytest.skip(f"cannot lower for CUDA here: {e}")
    assert len(modules) == 1 and modules[0].operation.verify()
