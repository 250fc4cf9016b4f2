"""Whole executables kept beside JAX's cache (compile_cache.*_executable): a second Generator, in
this process or another, loads its prefill and rounds without tracing them, with the same output;
other code, a bad entry or no cache directory never loads a wrong one (the key's shapes and
configs are the in-memory cache's own, which every Generator test exercises)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import jax
import pytest

from ddtree_jax import compile_cache
from ddtree_jax.generator import Generator
from tiny import tiny_pair

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [[1, 2, 3, 4, 5]]


@pytest.fixture
def kept(tmp_path):
    compile_cache._use_executables(tmp_path)
    yield tmp_path / "executables"
    compile_cache.disable_executables()


def run(ckpt, **kw):
    # JAX's in-process cache hands back an executable compiled before, which XLA:CPU may not
    # serialize (its sort's comparator): each run compiles afresh, as a new process would
    jax.clear_caches()
    lines = []
    gen = Generator(ckpt, method="ddtree", budget=8, log=lines.append, **kw)
    out = gen.generate_ids(PROMPTS, max_new_tokens=12)[0].token_ids
    return out, [line for line in lines if "compil" in line]


def test_a_second_generator_loads_what_the_first_compiled(kept, monkeypatch):
    ckpt = tiny_pair(seed=3)
    first, log = run(ckpt)
    assert len(list(kept.glob("*.pkl"))) == 2, "the prefill and the rounds are kept"
    assert sum("compiling" in line for line in log) == 2 and not any("loaded" in line for line in log)
    second, log = run(ckpt)
    assert second == first
    assert sum("loaded from the compile cache" in line for line in log) == 2, log
    assert not any("compiling" in line for line in log)
    # a bad entry (half written) is compiled again and written anew
    for f in kept.glob("*.pkl"):
        f.write_bytes(f.read_bytes()[:100])
    again, log = run(ckpt)
    assert again == first and sum("compiling" in line for line in log) == 2
    again, log = run(ckpt)
    assert again == first and sum("loaded" in line for line in log) == 2
    # other code is another entry
    monkeypatch.setattr(compile_cache, "source_fingerprint", lambda: "edited")
    _, log = run(ckpt)
    assert sum("compiling" in line for line in log) == 2, "an executable of other code was loaded"


def test_nothing_is_kept_without_a_cache_directory(tmp_path):
    compile_cache.disable_executables()
    assert compile_cache.executable_key(("x",)) is None
    out, log = run(tiny_pair(seed=3))
    assert out and not any("loaded" in line for line in log)


CHILD = """
import sys
sys.path.insert(0, {tests!r})
from pathlib import Path
from ddtree_jax import compile_cache
from ddtree_jax.generator import Generator
from tiny import tiny_pair
compile_cache._use_executables(Path({cache!r}))
lines = []
out = Generator(tiny_pair(seed=3), method="ddtree", budget=8, log=lines.append).generate_ids({prompts!r},
                                                                                       max_new_tokens=12)
print(sum("loaded from the compile cache" in line for line in lines), out[0].token_ids)
"""


def test_another_process_loads_them(tmp_path):
    """The key is stable across processes (no addresses or per-process hashes in it)."""
    code = CHILD.format(tests=str(ROOT / "tests"), cache=str(tmp_path), prompts=PROMPTS)
    outs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for p in outs:
        assert p.returncode == 0, p.stderr[-2000:]
    (n1, tokens1), (n2, tokens2) = (p.stdout.strip().splitlines()[-1].split(" ", 1) for p in outs)
    assert (n1, n2) == ("0", "2") and tokens1 == tokens2
