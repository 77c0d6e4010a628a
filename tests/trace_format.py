"""A validator of Chrome's trace-event format (JSON object form), for ``trace.json``."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def validate_trace(doc: Any) -> dict[tuple[int, int], str]:
    """Check ``doc`` against the trace-event format (JSON object form); return the name of
    every (pid, tid) track. Raises AssertionError naming the first violation."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list), "no traceEvents"
    assert doc.get("displayTimeUnit") in (None, "ms", "ns")
    names: dict[tuple[int, int], str] = {}
    processes: set[int] = set()
    last_ts: dict[tuple[int, int], int] = {}
    open_ends: dict[tuple[int, int], list[int]] = defaultdict(list)
    for e in doc["traceEvents"]:
        for key in ("ph", "name", "pid", "tid", "ts"):
            assert key in e, f"{key} missing in {e}"
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        assert e["ph"] in ("X", "M", "C"), f"unexpected phase {e['ph']!r}"
        track = (e["pid"], e["tid"])
        if e["ph"] == "M":
            assert e["name"] in METADATA, e
            value = e["args"]["sort_index" if e["name"].endswith("sort_index") else "name"]
            if e["name"] == "thread_name":
                names[track] = value
            elif e["name"] == "process_name":
                processes.add(e["pid"])
            continue
        if e["ph"] == "C":  # a counter: numeric values, in time order, of a named process
            assert e["pid"] in processes and e["args"], f"counter of no process: {e}"
            assert all(isinstance(v, int | float) for v in e["args"].values()), e
            key = (e["pid"], -1)  # counters keep their own order beside the process's tracks
            assert e["ts"] >= last_ts.get(key, 0), f"counter goes back in time: {e}"
            last_ts[key] = e["ts"]
            continue
        assert isinstance(e["ts"], int | float) and isinstance(e["dur"], int | float), e
        assert e["ts"] >= 0 and e["dur"] >= 0, e
        assert track in names and e["pid"] in processes, f"unnamed track {track}"
        assert isinstance(e["name"], str) and e["name"] and isinstance(e.get("args", {}), dict)
        assert e["ts"] >= last_ts.get(track, 0), f"ts goes back on {names[track]}: {e}"
        last_ts[track] = e["ts"]
        ends = open_ends[track]
        while ends and ends[-1] <= e["ts"]:
            ends.pop()
        assert not ends or e["ts"] + e["dur"] <= ends[-1], f"overlap on {names[track]}: {e}"
        ends.append(e["ts"] + e["dur"])
    return names
