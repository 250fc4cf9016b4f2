"""Token maps (`--draft-vocab`): a drafter restricted to part of the vocabulary drafts the same
trees over those tokens, never proposes another, and generation stays lossless."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ddtree_jax import engine, token_map
from ddtree_jax.errors import UserError
from ddtree_jax.checkpoint import DEFAULT_CKPT
from ddtree_jax.generator import Generator
from ddtree_jax.drafters import dflash as dmodel
from ddtree_jax.kernels.matmul import Int8Weight
from tiny import tiny_pair

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[5], [1, 2, 3, 4, 5, 6, 7], list(range(2, 33))]


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab=96)


@pytest.fixture(scope="module")
def ar_tokens(pair):
    return [r.token_ids for r in Generator(pair, method="ar").generate_ids(PROMPTS, max_new_tokens=24)]


def run(gen):
    res = gen.generate_ids(PROMPTS, max_new_tokens=24)
    return [r.token_ids for r in res], [r.acceptance_lengths for r in res]


def test_a_permuted_full_map_drafts_the_same_trees(pair):
    """Every token, in another order: the head's columns and the policy's indices are permuted,
    the ids mapped back, so the trees and with them every round's acceptance are unchanged."""
    ids = np.random.default_rng(0).permutation(pair.target_cfg.vocab_size).tolist()
    assert run(Generator(pair, method="ddtree", budget=24, draft_vocab=ids)) == run(Generator(pair, method="ddtree",
                                                                                             budget=24))


@pytest.mark.parametrize("budget,quant", [(24, "none"), (7, "int8")])
def test_a_part_of_the_vocabulary_is_lossless(pair, ar_tokens, budget, quant):
    ids = np.random.default_rng(budget).choice(pair.target_cfg.vocab_size, 40, replace=False).tolist()
    gen = Generator(pair, method="ddtree", budget=budget, draft_vocab=ids, drafter_quant=quant)
    assert run(gen)[0] == ar_tokens
    if quant == "none":  # DFlash (the chain policy) with the same map
        assert run(Generator(pair, method="dflash", draft_vocab=ids))[0] == ar_tokens


@pytest.mark.parametrize("policy,ids", [("ddtree", [5]), ("beam:width=4", [3, 4, 5])])
def test_maps_smaller_than_a_depth_of_the_tree(pair, ar_tokens, policy, ids):
    """One or three tokens against a 24-node tree: the slots they cannot fill stay invalid."""
    assert run(Generator(pair, method="ddtree", policy=policy, budget=24, draft_vocab=ids))[0] == ar_tokens


def test_trees_propose_only_mapped_tokens():
    """tree_stage maps the policy's indices into the map: node tokens are map[index], the root
    slot is the root token."""
    ids = jnp.asarray([17, 3, 40, 8, 25, 9], jnp.int32)
    logp = jax.nn.log_softmax(jax.random.normal(jax.random.PRNGKey(0), (2, 4, 6)), axis=-1)
    st = types.SimpleNamespace(root=jnp.asarray([11, 12], jnp.int32))
    spec = engine.DecodeSpec(budget=10, policy="ddtree")
    plain = engine.tree_stage(logp, st, spec=spec)
    mapped = engine.tree_stage(logp, st, ids, spec=spec)
    np.testing.assert_array_equal(mapped.tokens[:, 1:], np.asarray(ids)[np.asarray(plain.tokens[:, 1:])])
    np.testing.assert_array_equal(mapped.tokens[:, 0], [11, 12])
    np.testing.assert_array_equal(mapped.parents, plain.parents)
    assert set(np.asarray(mapped.tokens[:, 1:]).ravel()) <= set(np.asarray(ids).tolist())


def test_restrict_vocab_layout(pair):
    dp = dmodel.fuse_params(pair.drafter_params)
    head = pair.target_params["lm_head"]
    ids = jnp.asarray([5, 0, 9], jnp.int32)
    r = dmodel.restrict_vocab(dp, head, ids)
    np.testing.assert_array_equal(r["lm_head"], np.asarray(head)[:, [5, 0, 9]])
    np.testing.assert_array_equal(r["draft_vocab"], ids)
    assert engine.draft_vocab(r) is ids and engine.draft_vocab(dp) is None
    q = dmodel.restrict_vocab(dp, head, ids, quantize=True)
    assert isinstance(q["lm_head"], Int8Weight) and q["lm_head"].shape == (head.shape[0], 3)


@pytest.mark.parametrize("text,needle", [
    ("", "is empty"),
    ("[1, 2", "not valid JSON"),
    ("[1, 2.5]", "not a token id"),
    ('[1, "x"]', "not a token id"),
    ("1 2 -3", ">= 0"),
    ("1 2 3 2", "appears twice"),
    ("[true]", "not a token id"),
])
def test_bad_token_map_files(tmp_path, text, needle):
    p = tmp_path / "map.json"
    p.write_text(text)
    with pytest.raises(UserError, match=needle):
        token_map.read_token_map(p)
    with pytest.raises(UserError, match="not found"):
        token_map.read_token_map(tmp_path / "missing.json")


def test_token_map_files_read_both_formats(tmp_path):
    (tmp_path / "a.json").write_text("[4, 1, 7]")
    (tmp_path / "b.txt").write_text("4\n1\n\n7\n")
    assert token_map.read_token_map(tmp_path / "a.json") == token_map.read_token_map(tmp_path / "b.txt") == [4, 1, 7]


def test_bad_uses(pair):
    with pytest.raises(UserError, match="needs a DFlash drafter"):
        Generator(pair, method="ar", draft_vocab=[1, 2])
    with pytest.raises(UserError, match="beyond the target's vocabulary of 96"):
        Generator(pair, method="ddtree", draft_vocab=[1, 96])
    with pytest.raises(UserError, match="distinct"):
        Generator(pair, method="ddtree", draft_vocab=[1, 1])


def test_most_frequent_keeps_specials_and_breaks_ties_by_id():
    docs = [[5, 5, 3, 9], [3, 5, 9, 2], [7]]
    assert token_map.most_frequent(docs, 3) == [5, 3, 9]          # 3 and 9 tie: the smaller id first
    assert token_map.most_frequent(docs, 3, keep=[0]) == [0, 5, 3]
    assert token_map.most_frequent(docs, 10) == [5, 3, 9, 2, 7]   # fewer distinct ids than asked


def _cli(module, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def test_token_map_cli_on_the_shipped_pair(tmp_path, capsys):
    """Build a map from a small corpus with the shipped tokenizer (a second build refuses to
    overwrite), then generate with it through the CLI: the tokens are the AR ones."""
    from ddtree_jax.checkpoint import load_checkpoint
    from ddtree_jax.tokenizer import load_tokenizer

    corpus = tmp_path / "c.jsonl"
    code = "import os\n\n\ndef read(path):\n    with open(path) as f:\n        return f.read()\n"
    corpus.write_text("\n".join(json.dumps({"text": code * (i + 1)}) for i in range(5)) + "\n")
    out = tmp_path / "map.json"
    assert token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(corpus), "--size", "64", "--out", str(out)]) == 0
    ids = json.loads(out.read_text())
    assert 1 < len(ids) <= 64 and len(set(ids)) == len(ids) and "-> " in capsys.readouterr().err
    assert 0 in ids                                   # eos (id 0 in the shipped tokenizer) is kept
    with pytest.raises(UserError, match="already exists"):
        token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(corpus), "--out", str(out)])
    with pytest.raises(UserError, match="not found"):
        token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(tmp_path / "no.txt"), "--out", str(out), "--force"])
    r = _cli("ddtree_jax.generate", "--method", "ddtree", "--budget", 16, "--prompt", "def read(path):",
             "--max-new-tokens", 16, "--json", "--draft-vocab", out)
    assert r.returncode == 0, r.stderr
    ck = load_checkpoint(DEFAULT_CKPT, dtype="float32")   # the CLI's dtype on the CPU
    prompt = load_tokenizer(ck).encode("def read(path):", add_special_tokens=False)
    want = Generator(ck, method="ar").generate_ids([prompt], max_new_tokens=16, stop_ids=[0])[0].token_ids
    assert json.loads(r.stdout)["token_ids"] == want


def test_generate_checks_the_map_before_loading(tmp_path):
    bad = tmp_path / "map.json"
    bad.write_text("[1, 99999]")
    r = _cli("ddtree_jax.generate", "--prompt", "x", "--draft-vocab", bad)
    assert r.returncode == 2 and "beyond the target's vocabulary of 8192" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = _cli("ddtree_jax.generate", "--prompt", "x", "--method", "ar", "--draft-vocab", bad)
    assert r.returncode == 2 and "needs a drafter" in r.stderr


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder no file can be created in: a read-only one, or (for root, who writes anywhere) /proc."""
    import tempfile

    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(0o500)
    try:
        tempfile.TemporaryFile(dir=d).close()
    except OSError:
        return d
    return Path("/proc")


def test_token_map_checks_its_output_before_counting(tmp_path, monkeypatch, capsys):
    """An output that exists (without --force), is a folder, lies under a file, or where nothing can
    be written: one line (exit 2 through the CLI's contract), before the corpus is read."""
    from ddtree_jax.errors import cli_main

    corpus = tmp_path / "c.txt"
    corpus.write_text("def f():\n    return 1\n")
    monkeypatch.setattr(token_map, "corpus_texts", lambda path: pytest.fail("the corpus was read"))
    (tmp_path / "taken.json").write_text("[1]")
    (tmp_path / "file").write_text("x")
    cases = [(tmp_path / "taken.json", "already exists; pass --force"), (tmp_path, "is a directory"),
             (tmp_path / "file" / "map.json", "is a file, not a folder"),
             (_unwritable_folder(tmp_path) / "sub" / "map.json", "cannot write to")]
    for out, needle in cases:
        argv = ["--ckpt", str(DEFAULT_CKPT), "--data", str(corpus), "--out", str(out)]
        with pytest.raises(UserError, match=needle):
            token_map.main(argv)
        assert cli_main(token_map.main, argv, prog="ddtree_jax.token_map") == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("ddtree_jax.token_map: error: ") and needle in err, err
    assert (tmp_path / "taken.json").read_text() == "[1]" and sorted(p.name for p in tmp_path.iterdir()) == [
        "c.txt", "file", "read-only", "taken.json"]
    with pytest.raises(UserError, match="--size: invalid int value: 'many'"):
        token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(corpus), "--out", str(tmp_path / "m.json"),
                        "--size", "many"])


def test_token_map_refuses_an_empty_corpus_and_warns_on_a_small_one(tmp_path, capsys):
    """An empty corpus (no bytes, blank lines, empty texts) is refused and nothing is written; one
    with fewer distinct tokens than --size gives the smaller map and a warning line (exit 0)."""
    out = tmp_path / "map.json"
    for name, text in [("empty.txt", ""), ("blank.txt", "\n \n\t\n"), ("empty.jsonl", '{"text": ""}\n{"text": ""}\n')]:
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match="is empty|has no text"):
            token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(tmp_path / name), "--out", str(out)])
        assert not out.exists()
    small = tmp_path / "small.txt"
    small.write_text("abab abab\n")
    capsys.readouterr()
    assert token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(small), "--size", "100000", "--out",
                           str(out)]) == 0
    ids = json.loads(out.read_text())
    err = capsys.readouterr().err.splitlines()
    assert 1 < len(ids) < 20 and err[-1] == (f"[token_map] warning: the map holds {len(ids)} tokens, fewer than "
                                             f"--size 100000: the corpus has only {len(ids)} distinct tokens "
                                             "(special tokens included); a larger corpus fills more"), err
    assert token_map.main(["--ckpt", str(DEFAULT_CKPT), "--data", str(small), "--size", str(len(ids)), "--out",
                           str(out), "--force"]) == 0
    assert "warning" not in capsys.readouterr().err
