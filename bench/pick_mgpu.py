"""Print the fastest Mosaic GPU config per T from a bench_mgpu mgpu.json, as a
$DDTREE_MGPU_CONFIG value (``T:BKxSTAGESwWGS,...``), for the round A/B that follows it:

    export DDTREE_MGPU_CONFIG=$(python -m bench.pick_mgpu OUT/mgpu.json)

Only exact configs (rel_err < 2e-2, no NaN) count; a T where none ran prints nothing for it."""
from __future__ import annotations

import json
import sys


def pick(rows: list[dict]) -> str:
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        if r.get("config") == "triton" or "busy_us" not in r or r.get("nan") or r.get("rel_err", 1) >= 2e-2:
            continue
        t, us = r["t"], r["busy_us"]
        if t not in best or us < best[t][0]:
            best[t] = (us, r["config"])
    return ",".join(f"{t}:{cfg}" for t, (_, cfg) in sorted(best.items()))


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(pick(json.load(f)))
