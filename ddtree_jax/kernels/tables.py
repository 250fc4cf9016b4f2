"""The tuned-config tables beside the kernels (attention_configs.json, matmul_configs.json): how a
table is read and checked. Shared by the attention and matmul kernels; each keeps its own entry
check and lookup. The kernels read the shipped table; a tool that measures another passes it to
the lookup explicitly (``table=``)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

__all__ = ["read_device_table"]


@functools.lru_cache(maxsize=16)
def read_device_table(path: str, what: str, check=None, shipped: bool = False) -> dict:
    """A tuned-config table (JSON: device kind -> list of entries) from path, read and checked
    once per (path, ...): check(path, kind, entry) raises ValueError for a bad entry. A missing
    shipped table is empty (no tuned entries); any other missing file is an error. `what` only
    words the errors."""
    try:
        with open(path) as f:
            table = json.load(f)
    except FileNotFoundError:
        if shipped:
            return {}
        raise ValueError(f"{what} table {path} does not exist; fix the path") from None
    except (OSError, ValueError) as e:
        raise ValueError(f"unreadable {what} table {path}: {e}; fix it") from None
    if not isinstance(table, dict) or not all(isinstance(v, list) for v in table.values()):
        raise ValueError(f"{what} table {path} must map device kinds to lists of entries")
    for kind, entries in table.items():
        for e in entries if check else ():
            check(path, kind, e)
    return table


def table_file(path: str | Path | None, shipped: Path) -> tuple[str, bool]:
    """(path, is_shipped) of a table argument: the file given, else the shipped one."""
    return (str(shipped), True) if path is None else (str(path), False)
