"""bench round on hybrid (Gated DeltaNet + attention) targets: the random-weight tiny-hybrid shape
times every method and a Generator on it is lossless, the Qwen3.5 shapes are transformers'
defaults, and weights drawn from a name table (init_from_entries) are the layout loaders give."""
from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench import bench_round
from ddtree_jax.checkpoint import names
from ddtree_jax.generator import Generator
from ddtree_jax.models.config import DrafterConfig, MoeConfig, TargetConfig
from ddtree_jax.models.family import Hybrid
from ddtree_jax.models.hybrid import HybridConfig
from ddtree_jax.models.init import init_from_entries


def test_bench_round_times_every_method_on_the_tiny_hybrid_and_a_generator_on_it_is_lossless(tmp_path):
    # float32: where greedy decoding is exact under every method; the Generators below then find
    # the bench rows' executables (the same shapes) compiled
    argv = ["--model", "tiny-hybrid", "--methods", "ar,dflash,ddtree", "--budgets", "8", "--rounds", "2",
            "--repeats", "1", "--stage-repeats", "0", "--prompt-len", "16", "--dtype", "float32",
            "--out", str(tmp_path)]
    assert bench_round.main(argv) == 0
    out = json.loads((tmp_path / "round_tiny-hybrid_auto.json").read_text())
    assert "errors" not in out
    assert [(r["method"], r["budget"]) for r in out["rows"]] == [("ar", 0), ("dflash", 7), ("ddtree", 8)]
    tcfg = HybridConfig.from_hf(bench_round.hf_config("tiny-hybrid"))
    for r in out["rows"]:
        for k in ("round_ms_median", "round_ms_steady", "call_fixed_ms", "prefill_ms", "prefill_first_ms"):
            assert math.isfinite(r[k]), (r["method"], k, r[k])
        assert r["round_ms_median"] > 0 and r["prefill_ms"] > 0
        # the cache: KV of the attention layer and the GDN layers' conv and recurrent states
        assert r["recurrent_state_bytes"] == Hybrid.cache_bytes(tcfg, 1, 0, 4) > 0
        assert r["cache_bytes"] == Hybrid.cache_bytes(tcfg, 1, r["cache_size"], 4) > r["recurrent_state_bytes"]
    ar, dflash, ddtree = (r["verify_state_bytes"] for r in out["rows"])
    assert 0 < ar < dflash < ddtree  # a verify's new K/V and tree states grow with its rows

    ck = bench_round.build("tiny-hybrid", jnp.float32)
    cfg, params = ck.target_cfg, ck.target_params
    assert all(bool(jnp.isfinite(x).all()) for x in jax.tree_util.tree_leaves(params))
    for i in cfg.gdn_layers:
        lin = params["layers"][i]["linear"]
        decay = np.exp(np.asarray(lin["A_log"]))
        assert ((0.0199 <= decay) & (decay <= 0.801)).all() and (np.asarray(lin["dt_bias"]) == 1).all()
    # the inference layout: q_proj as a checkpoint holds it, fused with k and v; the GDN projections fused
    assert "qgkv" in params["layers"][cfg.attn_layers[0]] and "in_proj" in params["layers"][cfg.gdn_layers[0]]["linear"]
    # the bench rows' request: a 16-token prompt, room for 88 new tokens
    prompts = [np.random.default_rng(0).integers(0, 500, 16).tolist()]
    res = {m: Generator(ck, method=m, budget=8).generate_ids(prompts, max_new_tokens=88, temperature=0.0)[0]
           for m in ("ar", "ddtree")}
    assert len(res["ar"].token_ids) == 88
    assert res["ddtree"].token_ids == res["ar"].token_ids


def test_bench_round_times_both_gdn_tree_forms(tmp_path):
    """--gdn-tree parallel,recurrent: a DDTree round of each form in one call (the recurrent one
    through the interpreted kernel here); a form that does not exist is one line, exit 2."""
    argv = ["--model", "tiny-hybrid", "--methods", "ddtree", "--budgets", "8", "--rounds", "2", "--repeats", "1",
            "--stage-repeats", "0", "--prompt-len", "16", "--gdn-tree", "parallel,recurrent", "--out", str(tmp_path)]
    assert bench_round.main(argv) == 0
    out = json.loads((tmp_path / "round_tiny-hybrid_auto.json").read_text())
    assert "errors" not in out and [r["gdn_tree"] for r in out["rows"]] == ["parallel", "recurrent"]
    with pytest.raises(SystemExit) as e:
        bench_round.main(argv[:-4] + ["--gdn-tree", "chunked"])
    assert e.value.code == 2


def test_the_qwen35_shapes_are_transformers_defaults():
    """The hybrid shapes are read from transformers' configs, not typed: these are what they read."""
    pytest.importorskip("transformers", minversion="5")
    dense, drafter = bench_round.hybrid_configs("qwen3.5-9b")
    assert drafter.target_layer_ids == (1, 8, 15, 22, 29) and (drafter.num_layers, drafter.block_size) == (5, 16)
    assert (dense.hidden_size, dense.num_layers, dense.intermediate_size, dense.vocab_size) == (4096, 32, 12288, 248320)
    assert (dense.num_heads, dense.num_kv_heads, dense.head_dim, dense.rotary_dim) == (16, 4, 256, 64)
    assert dense.attn_layers == tuple(range(3, 32, 4)) and dense.moe is None
    g = dense.gdn
    assert (g.num_k_heads, g.num_v_heads, g.head_k_dim, g.head_v_dim, g.conv_kernel) == (16, 32, 128, 128, 4)
    moe, _ = bench_round.hybrid_configs("qwen3.5-35b-a3b")
    assert (moe.hidden_size, moe.num_layers, moe.num_heads, moe.num_kv_heads, moe.head_dim) == (2048, 40, 16, 2, 256)
    assert (moe.moe.num_experts, moe.moe.top_k, moe.moe.expert_intermediate, moe.moe.shared_intermediate) == \
        (256, 8, 512, 512)
    total = sum(math.prod(e.shape) for e in names.entries_for(moe))
    assert 34e9 < total < 36e9  # 35B
    big, _ = bench_round.hybrid_configs("qwen3.5-27b")   # the class at the 27B's published text config
    assert (big.hidden_size, big.num_layers, big.num_heads, big.num_kv_heads, big.intermediate_size) == \
        (5120, 64, 24, 4, 17408)
    assert big.attn_layers == tuple(range(3, 64, 4)) and (big.gdn.num_k_heads, big.gdn.num_v_heads) == (16, 48)
    assert 26.5e9 < sum(math.prod(e.shape) for e in names.entries_for(big)) < 27.5e9  # 27B


def _tiny_configs():
    hf = bench_round.hf_config("tiny-hybrid")
    hybrid_moe = HybridConfig.from_hf({**hf, "architectures": ["Qwen3_5MoeForCausalLM"], "num_experts": 4,
                                       "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                                       "shared_expert_intermediate_size": 24})
    dense = TargetConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                         head_dim=8, rms_eps=1e-6, max_position=256, tie_embeddings=False, qk_norm=True,
                         qkv_bias=True, family="qwen2_moe", architecture="Qwen2MoeForCausalLM",
                         moe=MoeConfig(num_experts=4, top_k=2, expert_intermediate=16, norm_topk_prob=False,
                                       shared_intermediate=24, sparse_layers=(False, True)))
    drafter = DrafterConfig(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                            rms_eps=1e-6, block_size=8, target_layer_ids=(0, 1), mask_token_id=63, num_target_layers=2,
                            vocab_size=64, sliding_windows=(None, None))
    return [HybridConfig.from_hf(hf), hybrid_moe, dense, drafter]


@pytest.mark.parametrize("cfg", _tiny_configs(), ids=["hybrid", "hybrid-moe", "qwen2-moe", "drafter"])
def test_weights_from_the_name_table_are_the_loaders_layout(cfg):
    entries = names.entries_for(cfg)
    params = jax.eval_shape(lambda k: init_from_entries(entries, k, jnp.float32), jax.random.key(0))
    names.check_params(cfg, params, where="init_from_entries")  # every path and shape, nothing else
    if isinstance(cfg, HybridConfig):
        fused = jax.eval_shape(lambda k: init_from_entries(entries, k, jnp.float32, fuse=Hybrid.fuse_params),
                               jax.random.key(0))
        # drawn, then fused a layer at a time: the layout fuse_params makes of the loader's
        want = jax.eval_shape(Hybrid.fuse_params, params)
        assert jax.tree_util.tree_structure(fused) == jax.tree_util.tree_structure(want)
        leaves = zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(want))
        assert all(a.shape == b.shape for a, b in leaves)
        assert all("in_proj" in fused["layers"][i]["linear"] for i in cfg.gdn_layers)
        if cfg.moe is not None:  # the layout models/moe.py reads
            e, h, ie = cfg.moe.num_experts, cfg.hidden_size, cfg.moe.expert_intermediate
            assert all(p["experts_gate_up"].shape == (e, h, 2 * ie) and "experts_gate" not in p
                       for p in fused["layers"])
