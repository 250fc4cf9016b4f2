"""A long greedy generation on the shipped pair: DDTree (budget 64) and AR give the same tokens.

The context is 2048 tokens and DDTree at budget 64 with the shipped drafter (block 16) needs
64 + 16 + 1 cache slots beyond prompt + new tokens, so 2,000 new tokens do not fit: the test
checks that the Generator refuses 2,000 with a one-line UserError, then generates the largest
count it accepts (1,964 after the 3-token prompt), with no stop ids, so exactly that many tokens.

The weights are cast to float32 on load. In the shipped bfloat16 the two runs part at token 1,793:
there the target's top two logits are 0.012 apart in float32 (13.117 vs 13.105) and bfloat16
rounding (different for the 65-token verify and the 1-token AR step) flips their order, a tie
and not an engine bug; in float32 the outputs are identical throughout.
"""
from __future__ import annotations

import time

import pytest

from conftest import DEFAULT_COMPILE

from ddtree_jax.checkpoint import DEFAULT_CKPT, load_checkpoint
from ddtree_jax.errors import UserError
from ddtree_jax.generator import Generator
from ddtree_jax.tokenizer import load_tokenizer

PROMPT = "import os\n"
WANTED = 2000
BUDGET = 64


def test_long_ddtree_generation_equals_autoregressive():
    ck = load_checkpoint(DEFAULT_CKPT, dtype="float32")
    ids = load_tokenizer(ck).encode(PROMPT, add_special_tokens=False)
    # ~2,900 rounds and steps to run: XLA's default code generation (the suite's cheapest-compile
    # flags would double the running time)
    ddtree = Generator(ck, method="ddtree", budget=BUDGET, compiler_options=DEFAULT_COMPILE)
    with pytest.raises(UserError, match="--budget 64 needs") as e:
        ddtree.check_request([len(ids)], WANTED, 0.0, 1.0)
    assert "\n" not in str(e.value)
    n = WANTED
    while n > 0:  # the largest count the context allows
        try:
            ddtree.check_request([len(ids)], n, 0.0, 1.0)
            break
        except UserError:
            n -= 1
    assert n >= 1900, n
    assert n + len(ids) + BUDGET + ck.drafter_cfg.block_size + 1 <= ck.target_cfg.max_position

    t0 = time.perf_counter()
    tree = ddtree.generate_ids([ids], max_new_tokens=n)[0]
    t_tree = time.perf_counter() - t0
    t0 = time.perf_counter()
    ar = Generator(ck, method="ar", compiler_options=DEFAULT_COMPILE).generate_ids([ids], max_new_tokens=n)[0]
    t_ar = time.perf_counter() - t0
    print(f"\n{n} tokens: ddtree {t_tree:.1f} s with compilation ({tree.time_s:.1f} s generating, "
          f"{tree.rounds} rounds, mean acceptance {tree.mean_acceptance:.2f}); "
          f"ar {t_ar:.1f} s ({ar.time_s:.1f} s generating)")
    assert ar.num_output_tokens == tree.num_output_tokens == len(ar.token_ids) == n
    first_diff = next((i for i, (a, b) in enumerate(zip(tree.token_ids, ar.token_ids)) if a != b), None)
    assert first_diff is None, f"ddtree and ar part at token {first_diff}"
    assert sum(tree.acceptance_lengths) >= n - 1  # the prefill gives the first token, rounds the rest
    assert tree.rounds < n / 1.5  # speculation did accept drafted tokens along the way
