"""The tuned-config tables beside the kernels (attention_configs.json, matmul_configs.json):
where a table comes from and how it is read and checked. Shared by the attention and matmul
kernels; each keeps its own entry check and lookup."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

__all__ = ["read_device_table", "table_path"]


def table_path(env: str, shipped: Path) -> tuple[str, bool]:
    """(path, named): the file `$env` names, else the shipped table beside the kernel."""
    named = os.environ.get(env)
    return (named, True) if named else (str(shipped), False)


@functools.lru_cache(maxsize=16)
def read_device_table(path: str, what: str, env: str, named: bool = False, check=None) -> dict:
    """A tuned-config table (JSON: device kind -> list of entries) from path, read and checked
    once per (path, ...): check(path, kind, entry) raises ValueError for a bad entry. A missing
    shipped table is empty; a missing file that `$env` names (named) is an error, not silently no
    table. Shared by the attention and matmul tables; `what` and `env` only word the errors."""
    try:
        with open(path) as f:
            table = json.load(f)
    except FileNotFoundError:
        if named:
            raise ValueError(f"${env} names {path}, which does not exist; fix the path or unset ${env}") from None
        return {}
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable {what} table {path}: {e}; fix it or unset ${env}") from None
    if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
        raise ValueError(f"{what} table {path} must map device kinds to lists of entries")
    for kind, entries in table.items():
        for e in entries if check else ():
            check(path, kind, e)
    return table
