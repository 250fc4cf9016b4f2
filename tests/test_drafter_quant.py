"""An int8 drafter (drafters.dflash.quantize_params): still lossless, and on the shipped pair it
drafts nearly as well as the full one."""
from __future__ import annotations

import numpy as np
import pytest

from ddtree_jax.errors import UserError
from ddtree_jax.generator import Generator
from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.kernels.matmul import Int8Weight
from tiny import tiny_pair

PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(2, 33))]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair()


def test_quantize_params_layout(pair):
    dp = dmodel.fuse_params(pair.drafter_params)
    head = pair.target_params["lm_head"]
    q = dmodel.quantize_params(dp, head)
    assert isinstance(q["fc"], Int8Weight) and isinstance(q["lm_head"], Int8Weight)
    assert q["lm_head"].shape == head.shape
    for p in q["layers"]:
        for name, leaf in p.items():
            assert isinstance(leaf, Int8Weight) == (name in dmodel.QUANT_MATRICES), name
    # the norms (stacked: layers.stack_norms) stay as they were
    assert sorted(q["norms"]) == sorted(dp["norms"])
    for name in dp["norms"]:
        np.testing.assert_array_equal(q["norms"][name], dp["norms"][name])


def test_int8_drafter_is_lossless(pair):
    """DDTree with the int8 drafter through the kernel (interpret mode) gives the AR tokens; XLA's
    dequantizing path is checked on the shipped pair below."""
    want = [r.token_ids for r in Generator(pair, method="ar").generate_ids(PROMPTS, max_new_tokens=20)]
    gen = Generator(pair, method="ddtree", budget=24, drafter_quant="int8", matmul_impl="pallas_interpret")
    assert [r.token_ids for r in gen.generate_ids(PROMPTS, max_new_tokens=20)] == want


def test_int8_drafter_bad_uses(pair):
    with pytest.raises(UserError, match="needs a DFlash drafter"):
        Generator(pair, method="ar", drafter_quant="int8")
    with pytest.raises(UserError, match="unknown --drafter-quant"):
        Generator(pair, method="ddtree", drafter_quant="int4")


def test_int8_drafter_acceptance_on_the_shipped_pair():
    """Real weights: the int8 drafter's greedy acceptance stays within 10 % of the full drafter's
    (DDTree-16 on 4 eval-split prompts x 64 tokens, float32 target), and the tokens do not change."""
    from bench import prompts as bp
    from ddtree_jax.checkpoint import DEFAULT_CKPT, load_checkpoint
    from ddtree_jax.tokenizer import load_tokenizer

    ck = load_checkpoint(DEFAULT_CKPT, dtype="float32")
    tok = load_tokenizer(ck)
    prompts = [list(p.ids) for p in bp.from_corpus(tok, bp.default_data(), 4, 128)]  # the shipped eval prompts
    acc, tokens = {}, {}
    for quant in ("none", "int8"):
        res = Generator(ck, method="ddtree", budget=16, drafter_quant=quant).generate_ids(prompts, max_new_tokens=64)
        tokens[quant] = [r.token_ids for r in res]
        acc[quant] = np.mean([a for r in res for a in r.acceptance_lengths])
    assert tokens["int8"] == tokens["none"]   # both are the target's greedy tokens (the AR ones: test_default_model)
    assert acc["none"] > 2.0, acc
    assert acc["int8"] >= 0.9 * acc["none"], acc
