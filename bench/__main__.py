"""`python -m bench COMMAND [ARGS]`: every benchmark of the project from one entry.

    python -m bench --out DIR                 # the suite on the shipped pair (= python -m bench suite --out DIR)
    python -m bench round --model qwen3-8b --out DIR
    python -m bench --help                    # the commands
    python -m bench COMMAND --help            # a command's options

Each command is a module of this package with a `main(argv)`, imported only when it runs.
`bash bench/device.sh` runs them on a device machine; the current figures are bench/RESULTS.md.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Sequence

from ddtree_jax.errors import UserError, cli_main

# command: module, in the order `--help` lists them; a module that is not there drops out
COMMANDS = {
    "suite": "bench.suite",
    "throughput": "bench.throughput",
    "merge": "bench.merge",
    "plots": "bench.plots",
    "draft-vocab": "bench.draft_vocab",
    "prompts": "bench.prompts",
    "round": "bench.bench_round",
    "checkpoint": "bench.checkpoint",
    "fit-cost": "bench.fit_cost",
    "profile": "bench.profile_round",
    "kernels": "bench.bench_kernels",
    "gemm": "bench.bench_gemm",
    "mgpu": "bench.bench_mgpu",
    "profile-mgpu": "bench.profile_mgpu",
    "check-gpu": "bench.check_gpu",
    "tree": "bench.bench_tree",
    "check-tree": "bench.check_tree",
}


def available() -> dict[str, str]:
    """The commands whose module exists (nothing is imported)."""
    return {name: mod for name, mod in COMMANDS.items() if importlib.util.find_spec(mod) is not None}


def summary(module: str) -> str:
    """The first line of a module's docstring, read from its source (importing would load JAX)."""
    spec = importlib.util.find_spec(module)
    try:
        doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError, TypeError):
        doc = ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def usage() -> str:
    cmds = available()
    width = max(map(len, cmds))
    lines = [__doc__.strip(), "", "commands:"]
    lines += [f"  {name:<{width}}  {summary(mod)}" for name, mod in cmds.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = ("suite", args) if args[0].startswith("-") else (args[0], args[1:])
    cmds = available()
    if name not in cmds:
        raise UserError(f"unknown command {name!r}; choose from {', '.join(cmds)} (python -m bench --help)")
    run = getattr(importlib.import_module(cmds[name]), "main", None)
    if run is None:
        raise UserError(f"{cmds[name]} has no main(argv); run it as python -m {cmds[name]}")
    return int(run(rest) or 0)


if __name__ == "__main__":
    sys.exit(cli_main(main, prog="bench"))
