"""The layout's rules, read off the source: imports run one way (kernels <- models / trees /
drafters <- engine <- generator <- cli), no module imports itself back through others, the
library never imports the `convert` command or the benchmarks, no environment variable is read
outside the few README documents, and nothing in the product narrates past work."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ddtree_jax", "convert", "bench")

# group -> the groups its modules may import (besides their own group and the leaves)
LEAVES = {"errors", "tuning", "compile_cache", "cost"}
ALLOWED = {
    "kernels": set(),
    "models": {"kernels"},
    "trees": {"kernels"},
    "drafters": {"kernels", "models"},
    "round": {"kernels", "models", "trees"},            # walk.py, sampling.py
    "checkpoint": {"models", "drafters"},               # drafters: the DFlash 2 config a drafter dir may hold
    "tokenizer": set(),
    "token_map": {"models", "checkpoint", "tokenizer"},
    "engine": {"kernels", "models", "trees", "drafters", "round"},
    "profile": {"kernels", "models", "trees", "drafters", "round", "engine"},
    "sharding": {"models"},                             # sharding.py: placements of weights and caches
    "generator": {"kernels", "models", "trees", "drafters", "round", "engine", "profile", "checkpoint", "token_map",
                  "sharding"},
    "cli": {"kernels", "models", "trees", "drafters", "round", "engine", "profile", "checkpoint", "token_map",
            "tokenizer", "generator", "sharding"},
    "train": {"kernels", "models", "trees", "drafters", "round", "checkpoint", "token_map", "tokenizer"},
    # python -m ddtree_jax.research: the command line's checks and prompts, the engine's stages
    "research": {"kernels", "models", "trees", "drafters", "round", "engine", "profile", "checkpoint", "token_map",
                 "tokenizer", "generator", "cli", "train"},
    "package": {"trees"},                                # ddtree_jax/__init__.py
    "convert": {"models", "checkpoint", "package"},
    "bench": None,                                       # anything
}
# Environment variables the product reads: README's two settings (and JAX's own, set for tests).
ENV_READERS = {"ddtree_jax/compile_cache.py", "ddtree_jax/generator.py"}


def _hidden(path: Path) -> bool:
    """Under a dot folder (git-ignored work trees such as bench/.ab_base): not the product."""
    return any(part.startswith(".") for part in path.relative_to(ROOT).parts)


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if _hidden(path):
                continue
            rel = path.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods[".".join(parts)] = path
    return mods


def _group(mod: str) -> str:
    parts = mod.split(".")
    if parts[0] in ("convert", "bench"):
        return parts[0]
    if len(parts) == 1:
        return "package"
    name = parts[1]
    if name in ("walk", "sampling"):
        return "round"
    if name == "generate":
        return "cli"
    return "leaf" if name in LEAVES else name


def _imports(path: Path, mod: str, mods: dict[str, Path]) -> set[str]:
    """The project modules `mod` imports anywhere in its file (function bodies included)."""
    out = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]
            if not any(n in mods for n in names):  # names from a module, not submodules of a package
                names = [base]
        else:
            continue
        for name in names:
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod:
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, m, mods) for m, p in mods.items()}


def test_imports_run_one_way():
    wrong = []
    for mod, deps in _graph().items():
        g = _group(mod)
        allowed = ALLOWED.get(g, set())
        for dep in deps:
            d = _group(dep)
            if allowed is None or d in (g, "leaf") or d in allowed or (g == "leaf" and d == "leaf"):
                continue
            if g == "leaf" and dep.split(".")[1] in LEAVES:
                continue
            wrong.append(f"{mod} ({g}) imports {dep} ({d})")
    assert not wrong, "imports that run backwards:\n" + "\n".join(sorted(wrong))


def test_leaves_import_no_other_part_of_the_package():
    for mod, deps in _graph().items():
        if _group(mod) == "leaf":
            assert all(_group(d) == "leaf" for d in deps), (mod, deps)


def test_no_import_cycles():
    graph = _graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_environment_read_only_where_readme_says():
    readers = []
    for pkg in ("ddtree_jax", "convert"):
        for path in (ROOT / pkg).rglob("*.py"):
            if _hidden(path):
                continue
            rel = str(path.relative_to(ROOT))
            if re.search(r"os\.environ(\.get|\[)|os\.getenv", path.read_text()) and rel not in ENV_READERS:
                readers.append(rel)
    assert not readers, f"environment read outside README's settings: {readers}"


def test_the_product_narrates_no_past_work():
    pattern = re.compile(r"\bsessions?\s+\d|\bs\d{1,2}[a-h](_\d)?\b|\bsession\s+\d", re.I)
    files = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / "bench" / "RESULTS.md"]
    for pkg in ("ddtree_jax", "convert", "bench", "tests"):
        files += [p for p in (ROOT / pkg).rglob("*") if p.suffix in (".py", ".md", ".sh", ".toml") and not _hidden(p)]
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
            for p in files if p.is_file() for n, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line) and "pattern" not in line]
    assert not hits, "past work named in the product:\n" + "\n".join(hits[:40])
