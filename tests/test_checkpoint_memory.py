"""Converting and loading hold about one tensor at a time on the host, never the whole model.

A random Qwen3 model of ~330 MB (bf16, in shards) is converted and generated from; each command's
peak resident memory is compared with the same command on the tiny fixture pair (the same imports,
compilation and code paths, negligible weights). Holding the model's whole param tree, as the
orbax save and restore did, breaks both bounds by hundreds of MB.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import ROOT
from hf_fixtures import make_drafter, make_target, make_tokenizer

MB = 2**20
# Interpreter and allocator noise between two runs of one command on different models.
MARGIN = 64 * MB

# The largest tensors are the [32768, 1024] embedding and LM head: 64 MiB each in bf16.
SIZE = dict(vocab=32768, hidden=1024, layers=8, heads=16, kv_heads=8, head_dim=64, intermediate=3072,
            max_position=1024)
LARGEST = SIZE["vocab"] * SIZE["hidden"] * 2


def peak_rss(*cmd) -> int:
    """Peak resident bytes of `cmd`, run as the only child of a fresh process (ru_maxrss of the
    children covers every child ever waited for, so the test process's own would not do)."""
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)\n"
            "assert r.returncode == 0, r.stderr\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", code, sys.executable, *map(str, cmd)], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    return int(r.stdout) * 1024  # kilobytes on Linux


@pytest.fixture(scope="module")
def big_pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    target = make_target(d / "hf_target", "qwen3", sharded=True, dtype="bfloat16", **SIZE)
    make_tokenizer(target, vocab_size=320)
    draft = make_drafter(d / "hf_draft", target, layers=1, target_layer_ids=[1, 6], dtype="bfloat16")
    weights = sum(f.stat().st_size for f in [*target.glob("*.safetensors"), *draft.glob("*.safetensors")])
    return target, draft, weights


def test_convert_holds_one_tensor(big_pair, qwen3_pair, tmp_path):
    target, draft, weights = big_pair
    assert len(list(target.glob("*.safetensors"))) >= 3 and weights > 300 * MB
    tiny = peak_rss("-m", "convert", "--target", qwen3_pair.hf_target, "--draft", qwen3_pair.hf_draft,
                    "--out", tmp_path / "tiny", "--dtype", "bfloat16")
    big = peak_rss("-m", "convert", "--target", target, "--draft", draft, "--out", tmp_path / "big")
    # a tensor's raw bytes and its transposed copy (3x leaves room for a cast as well)
    bound = MARGIN + 3 * LARGEST
    assert big - tiny <= bound < weights, f"grew {(big - tiny) / MB:.0f} MB, bound {bound / MB:.0f} MB"


def test_generate_loads_one_tensor_at_a_time(big_pair, qwen3_pair, tmp_path):
    """On the CPU the device's memory is the process's: the float32 weights (twice the bf16
    files) are resident by design; beyond them, the host may hold a tensor and its cast copy."""
    target, draft, weights = big_pair
    subprocess.run([sys.executable, "-m", "convert", "--target", target, "--draft", draft, "--out", tmp_path / "ck"],
                   cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, capture_output=True)
    args = ("--max-new-tokens", 4, "--budget", 4, "--prompt", "def f(x):")
    tiny = peak_rss("-m", "ddtree_jax.generate", "--ckpt", qwen3_pair.out, *args)
    big = peak_rss("-m", "ddtree_jax.generate", "--ckpt", tmp_path / "ck", *args)
    on_device = 2 * weights
    bound = on_device + MARGIN + 2 * (2 * LARGEST)
    assert big - tiny <= bound < 2 * on_device, f"grew {(big - tiny) / MB:.0f} MB, bound {bound / MB:.0f} MB"


def test_a_cast_or_transposed_matrix_is_read_in_blocks(tmp_path, monkeypatch):
    """TensorInfo.load reads a matrix it casts or transposes a block of rows at a time into the
    result: the host holds the result and one block, not the raw tensor beside it."""
    import tracemalloc

    import numpy as np
    from safetensors.numpy import save_file

    from ddtree_jax.checkpoint import tensors

    w = np.random.default_rng(0).standard_normal((1000, 3000), np.float32)
    save_file({"w": w}, str(tmp_path / "m.safetensors"))
    info = tensors.read_header(tmp_path / "m.safetensors")["w"]
    monkeypatch.setattr(tensors, "LOAD_BLOCK_BYTES", 1 * MB)    # 87 rows of 12000 bytes a block
    for dtype, transpose, want in ((None, True, w.T), (np.float16, False, w.astype(np.float16)),
                                   (np.float16, True, w.T.astype(np.float16)), (None, False, w)):
        tracemalloc.start()
        got = info.load(dtype, transpose)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert got.flags.c_contiguous and got.dtype == want.dtype and np.array_equal(got, want)
        assert peak <= got.nbytes + 2 * MB, (dtype, transpose, peak)   # reading it whole: 2 x 12 MB
