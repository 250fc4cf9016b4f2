"""A `run_rounds` call's phases on the host clock, from XLA's command-buffer log.

    TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 \\
        python -m bench.probe_call_fixed --model qwen3-8b --log-calls ... > LOG 2>&1
    python -m bench.call_phases LOG [--json OUT]

XLA logs one "Execute command buffer" line (microsecond timestamp) each time it launches a
command buffer, so once a round inside a call; `probe_call_fixed --log-calls` prints each
call's start and end on the same clock. Per call this gives the time from its start to the
first launch (dispatch, and any command-buffer update: "Update command buffer" lines are
counted), the launch-to-launch time of its rounds, and the time from the last launch to the
end (the last round and the output). No profiler runs, so nothing is slowed down by one.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

_GLOG = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+)\s")
_CALL = re.compile(r"\[probe_call_fixed\] call (\S+) (\d+) rounds from (\d\d):(\d\d):(\d\d\.\d+) "
                   r"to (\d\d):(\d\d):(\d\d\.\d+) \(([\d.]+) ms\)")


def _seconds(h: str, m: str, s: str) -> float:
    return int(h) * 3600 + int(m) * 60 + float(s)


def parse(text: str) -> tuple[list[dict], list[float], list[float]]:
    """(calls: mode, rounds, start, end, ms; launch times; update times), seconds of the day."""
    calls, launches, updates = [], [], []
    for line in text.splitlines():
        c = _CALL.search(line)
        if c:
            calls.append({"mode": c[1], "rounds": int(c[2]), "start": _seconds(*c.group(3, 4, 5)),
                          "end": _seconds(*c.group(6, 7, 8)), "ms": float(c[9])})
            continue
        g = _GLOG.match(line)
        if g and "Execute command buffer" in line:
            launches.append(_seconds(*g.groups()))
        elif g and "Update command buffer" in line:
            updates.append(_seconds(*g.groups()))
    return calls, sorted(launches), sorted(updates)


def phases(calls: list[dict], launches: list[float], updates: list[float]) -> list[dict]:
    """Each call's phases in ms: to its first launch, median launch-to-launch, after its last
    launch; launches and updates inside it."""
    out = []
    for c in calls:
        inside = [t for t in launches if c["start"] <= t <= c["end"]]
        if not inside:
            out.append(dict(c, launches=0, updates=0))
            continue
        steps = [1e3 * (b - a) for a, b in zip(inside, inside[1:])]
        out.append(dict(c, launches=len(inside), updates=sum(c["start"] <= t <= c["end"] for t in updates),
                        to_first_launch_ms=1e3 * (inside[0] - c["start"]),
                        launch_to_launch_ms=statistics.median(steps) if steps else None,
                        after_last_launch_ms=1e3 * (c["end"] - inside[-1])))
    return out


def summary(rows: list[dict]) -> dict:
    """Medians by (mode, rounds) of the phases, over calls with launches."""
    keys = ("ms", "to_first_launch_ms", "launch_to_launch_ms", "after_last_launch_ms", "launches", "updates")
    groups: dict = {}
    for r in rows:
        if r["launches"]:
            groups.setdefault(f"{r['mode']} {r['rounds']}", []).append(r)
    return {k: {f: statistics.median(r[f] for r in v if r.get(f) is not None) for f in keys} | {"calls": len(v)}
            for k, v in groups.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.call_phases", description=__doc__.splitlines()[0])
    ap.add_argument("log", help="probe_call_fixed --log-calls output with XLA's command-buffer log (VLOG 3)")
    ap.add_argument("--json", default=None, help="write every call's phases and the summary here")
    args = ap.parse_args(argv)
    path = Path(args.log)
    if not path.is_file():
        ap.error(f"no log at {path}")
    calls, launches, updates = parse(path.read_text(errors="replace"))
    if not calls:
        ap.error(f"{path} has no '[probe_call_fixed] call' lines: run the probe with --log-calls")
    if not launches:
        ap.error(f"{path} has no 'Execute command buffer' lines: run with TF_CPP_MIN_LOG_LEVEL=0 "
                 "TF_CPP_VMODULE=command_buffer_thunk=3")
    rows = phases(calls, launches, updates)
    summ = summary(rows)
    for k, s in summ.items():
        print(f"[call_phases] {k:16s} {s['calls']:2d} calls: {s['ms']:8.3f} ms, to the first launch "
              f"{s['to_first_launch_ms']:.3f}, launch to launch {s['launch_to_launch_ms']:.3f}, after the last "
              f"{s['after_last_launch_ms']:.3f}; {s['launches']:.0f} launches, {s['updates']:.0f} updates")
    if args.json:
        Path(args.json).write_text(json.dumps({"calls": rows, "summary": summ}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
