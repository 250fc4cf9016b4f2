"""Session fixtures: tiny random HF checkpoints, converted once (float32) through the convert CLI.

    qwen3_pair     Qwen3 target (untied, with a tokenizer) + 2-layer DFlash drafter (block 8, taps [1, 2])
    llama_target   Llama target, tied embeddings, llama3 rope scaling
    qwen2_sharded  Qwen2 target (q/k/v biases), saved in >= 3 safetensors shards
    qwen3_last_tap Qwen3 target (final norm weights far from 1) + a copy drafter tapping layers [1, 3],
                   the last one included (hf_fixtures.make_copy_drafter; block 8)

Each is a `Converted(hf_target, hf_draft, out)`; `out` is the converted checkpoint directory,
to be read with `ddtree_jax.checkpoint.load_checkpoint`. Sizes: see tests/hf_fixtures.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
for p in (str(ROOT), str(ROOT / "tests")):
    if p not in sys.path:
        sys.path.insert(0, p)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Mosaic GPU interpret mode deadlocked 2-core CI runs with XLA's CPU pools sized by the cores
# (see prepare_cpu_for_interpret); the pool size must be set before jax starts.
from ddtree_jax.kernels.tree_attention_mgpu import prepare_cpu_for_interpret  # noqa: E402

prepare_cpu_for_interpret()


# Compiling is most of this suite's time on the CPU. LLVM without its optimisation passes compiles
# ~40 % faster (XLA's passes all still run), and XLA:CPU's elemental emitters in place of its MLIR
# fusion emitters take another ~40 % off (the same running time on these models). The tests whose
# time is running, not compiling, ask for LLVM's defaults back (DEFAULT_COMPILE).
# DDTREE_TEST_FAST_COMPILE=0 runs the suite with XLA's defaults throughout.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false")
# the LLVM flags above, as compile options (Generator(compiler_options=...), jax.jit(compiler_options=...))
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
# XLA's defaults of the LLVM flags
DEFAULT_COMPILE = {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False}


def _fast_compile_flags() -> None:
    """FAST_COMPILE_FLAGS into XLA_FLAGS, for this process and the CLIs the tests start, unless
    turned off or this jaxlib lacks one (an unknown flag in XLA_FLAGS aborts every jax process, so
    a child process tries them first; the xdist workers inherit the result)."""
    if os.environ.get("DDTREE_TEST_FAST_COMPILE", "1") == "0" or FAST_COMPILE_FLAGS in os.environ.get("XLA_FLAGS", ""):
        return
    import subprocess

    flags = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1).block_until_ready()"],
                           env=dict(os.environ, XLA_FLAGS=flags), capture_output=True)
    if probe.returncode == 0:
        os.environ["XLA_FLAGS"] = flags


_fast_compile_flags()
# In-process CLI runs would turn JAX's persistent cache on for the rest of a worker; loading an
# XLA:CPU executable that another process wrote can crash the loader (jax-ml/jax#28908), so test
# workers compile for themselves. The CLI subprocesses the tests start share the cache above.
import jax  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)


def _compile_interpreted_threads_once() -> None:
    """Mosaic GPU's interpret mode runs a kernel's grid points one after the other, each as one
    CPU computation a warpgroup, and jax's thread_map._run_jaxpr compiles that computation anew
    every time (an AOT compile, which no cache keeps): the same program, 1-5 s a compile, dozens
    of times a kernel call. Here each (program, argument types) compiles once and every grid
    point's threads run that executable on their own inputs, as before. Left alone where this
    jax's _run_jaxpr is not the one replaced."""
    import functools
    import inspect
    import threading

    try:
        from jax._src.pallas.mosaic.interpret import thread_map
        source = inspect.getsource(thread_map._run_jaxpr)
    except (ImportError, AttributeError, OSError, TypeError):
        return
    if "traced.lower().compile()(consts, *args)" not in source:
        return
    from jax import core as jax_core

    def _run(jaxpr, consts, *args):
        jax_core.eval_jaxpr(jaxpr, consts, *args)

    lock = threading.Lock()  # a grid point's threads ask for one program at once: one compiles it

    @functools.lru_cache(maxsize=None)
    def compiled(jaxpr, tree, types):
        consts, args = jax.tree.unflatten(tree, [jax.ShapeDtypeStruct(s, d) for s, d in types])
        return jax.jit(_run, static_argnums=(0,)).trace(jaxpr, consts, *args).lower().compile()

    def run_jaxpr(jaxpr, consts, *args):
        leaves, tree = jax.tree.flatten((consts, args))
        # shapes and dtypes as the arrays state them (reading a jax array's value here would wait)
        types = tuple((np.shape(x), x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype) for x in leaves)
        with lock:
            program = compiled(jaxpr, tree, types)
        program(consts, *args)

    thread_map._run_jaxpr = run_jaxpr
    globals()["_interpreted_thread_programs"] = compiled  # module level: release_executables clears it


_compile_interpreted_threads_once()
if "DDTREE_COMPILE_CACHE" not in os.environ:  # the CLIs' compile cache: per test session, not ~/.cache
    import tempfile

    os.environ["DDTREE_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="ddtree-xla-cache-")

from hf_fixtures import make_copy_drafter, make_drafter, make_target, make_tokenizer  # noqa: E402

# XLA:CPU maps ~3 memory regions for every compiled kernel while its executable lives; a worker
# holding every executable of half the suite passes the kernel's vm.max_map_count (65530), and the
# next compile's mmap fails inside LLVM (SIGSEGV or SIGABRT). Past this many regions, the end of a
# test module drops every executable only caches still hold.
MAPPED_REGIONS_BUDGET = 20_000


def mapped_regions() -> int:
    """Memory regions this process has mapped (0 where /proc is not there)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def release_executables() -> None:
    """Drop JAX's caches and every functools cache of the tests and the package (compiled
    functions among them), then collect."""
    import functools
    import gc

    for mod in list(sys.modules.values()):
        where = getattr(mod, "__file__", None) or ""
        if not where.startswith(str(ROOT)):
            continue
        for value in list(vars(mod).values()):
            if isinstance(value, functools._lru_cache_wrapper):
                value.cache_clear()
    jax.clear_caches()
    gc.collect()


@contextlib.contextmanager
def xla_default_emitters():
    """Compiles inside run with XLA:CPU's default fusion emitters: a bitwise test that compares a
    many-row program with a one-row one checks the kernels' reduction order, and the elemental
    emitters of FAST_COMPILE_FLAGS may vectorise a row's reduction by the row count."""
    from jax._src import compiler

    original = compiler.get_compile_options

    def with_emitters(*args, env_options_overrides=None, **kwargs):
        overrides = {"xla_cpu_use_fusion_emitters": True, **(env_options_overrides or {})}
        return original(*args, env_options_overrides=overrides, **kwargs)

    release_executables()  # nothing compiled with the other emitters may be reused
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compiler, "get_compile_options", with_emitters)
        yield


@pytest.fixture(scope="module")
def module_default_emitters():
    with xla_default_emitters():
        yield


@pytest.fixture(scope="module", autouse=True)
def _bounded_executables():
    yield
    if mapped_regions() > MAPPED_REGIONS_BUDGET:
        release_executables()

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128}


@dataclasses.dataclass(frozen=True)
class Converted:
    hf_target: Path
    hf_draft: Path | None
    out: Path


def convert_cli(*args: str | Path) -> None:
    """Run the convert CLI in-process; fail the test with its message on a non-zero exit."""
    from convert import main

    rc = main([str(a) for a in args])
    assert rc == 0, f"python -m convert {' '.join(map(str, args))} exited with {rc}"


@pytest.fixture(scope="session")
def qwen3_pair(tmp_path_factory) -> Converted:
    d = tmp_path_factory.mktemp("qwen3_pair")
    target = make_target(d / "hf_target", "qwen3", vocab=384)
    make_tokenizer(target, vocab_size=320)
    draft = make_drafter(d / "hf_draft", target, layers=2, block_size=8, target_layer_ids=[1, 2])
    convert_cli("--target", target, "--draft", draft, "--out", d / "converted", "--dtype", "float32")
    return Converted(target, draft, d / "converted")


@pytest.fixture(scope="session")
def llama_target(tmp_path_factory) -> Converted:
    d = tmp_path_factory.mktemp("llama")
    target = make_target(d / "hf_target", "llama", tie=True, rope_scaling=LLAMA3_ROPE)
    convert_cli("--target", target, "--out", d / "converted", "--dtype", "float32")
    return Converted(target, None, d / "converted")


@pytest.fixture(scope="session")
def qwen2_sharded(tmp_path_factory) -> Converted:
    d = tmp_path_factory.mktemp("qwen2")
    target = make_target(d / "hf_target", "qwen2", sharded=True)
    convert_cli("--target", target, "--out", d / "converted", "--dtype", "float32")
    return Converted(target, None, d / "converted")


@pytest.fixture(scope="session")
def qwen3_moe_pair(tmp_path_factory) -> Converted:
    """A Qwen3-MoE target (8 experts, top 2, renormalised; layer 1 dense) with a DFlash drafter."""
    d = tmp_path_factory.mktemp("qwen3_moe_pair")
    target = make_target(d / "hf_target", "qwen3_moe", vocab=384, norm_topk_prob=True, mlp_only_layers=[1])
    draft = make_drafter(d / "hf_draft", target, layers=2, block_size=8, target_layer_ids=[1, 2])
    convert_cli("--target", target, "--draft", draft, "--out", d / "converted", "--dtype", "float32")
    return Converted(target, draft, d / "converted")


@pytest.fixture(scope="session")
def qwen2_moe_sharded(tmp_path_factory) -> Converted:
    """A Qwen2-MoE target with a shared expert, sharded, its experts fused 3-D."""
    d = tmp_path_factory.mktemp("qwen2_moe")
    target = make_target(d / "hf_target", "qwen2_moe", sharded=True, expert_layout="fused")
    convert_cli("--target", target, "--out", d / "converted", "--dtype", "float32")
    return Converted(target, None, d / "converted")


@pytest.fixture(scope="session")
def qwen3_last_tap(tmp_path_factory) -> Converted:
    d = tmp_path_factory.mktemp("qwen3_last_tap")
    target = make_target(d / "hf_target", "qwen3", vocab=384, final_norm_noise=1.0)
    draft = make_copy_drafter(d / "hf_draft", target, target_layer_ids=[1, 3], block_size=8)
    convert_cli("--target", target, "--draft", draft, "--out", d / "converted", "--dtype", "float32")
    return Converted(target, draft, d / "converted")
