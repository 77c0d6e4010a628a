"""``trace.json``: a run's timeline in Chrome's trace-event format (Perfetto, chrome://tracing).

Built from the same records as ``events.parquet`` and ``samples.parquet``, so a simulated
and a live run give the same kind of trace. Open it at https://ui.perfetto.dev (or
``chrome://tracing``) and zoom into any iteration.

Layout: one process per resource (``gen-<i>``, ``trainer``, ``link-<a>-<b>``), whose first
thread is the resource's own track: its spans from ``events.parquet`` as complete events
(``ph: "X"``), named by kind and by the iteration, step or weight version they belong to
(``decode · iter 3``, ``train · step 3``, ``weight_sync · v4``). Spans that overlap without
nesting (a live weight load straddling the end of a busy period) go to an extra lane
(``gen-0 · lane 1``), as the format needs events on one thread to nest. Below an instance,
its samples (``sample 17``, from generation start to end, with prompt, group, versions
and reward as arguments) fill as many lanes as ran at once; below the trainer, its
optimizer steps (``step 3``). A live run adds a last process, ``host cpu``, whose counter
``cores used`` holds the cores each role of the run used (``cpu_timeline.csv``). Times are
microseconds from the run's start.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from policies.records import SampleRecord, Span, SpanKind
from policies.resources import TRAINER

US_PER_S = 1_000_000
STEP_LANE = "steps"
SAMPLE_LANE = "samples"


@dataclass(frozen=True, slots=True)
class _Slice:
    name: str
    start_us: int
    end_us: int
    args: dict[str, Any]


def _us(seconds: float) -> int:
    return round(seconds * US_PER_S)


def _known(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments that have a (finite) value."""
    finite = math.isfinite
    return {k: v for k, v in args.items() if v is not None and (type(v) is not float or finite(v))}


def _resource_order(name: str) -> tuple[int, int, str]:
    if name.startswith("gen-") and name[4:].isdigit():
        return (0, int(name[4:]), name)
    return (1, 0, name) if name == TRAINER else (2, 0, name)


def span_name(span: Span) -> str:
    """``kind`` plus the iteration (instances), step (trainer) or version (transfers)."""
    kind = str(span.kind)
    if span.iteration is None:
        return kind
    if span.kind == SpanKind.WEIGHT_SYNC and not span.resource.startswith("gen-"):
        return f"{kind} · v{span.iteration + 1}"  # transfers carry the step that made them
    if span.resource == TRAINER:
        return f"{kind} · step {span.iteration}"
    return f"{kind} · iter {span.iteration}"


def _span_slice(span: Span) -> _Slice:
    args = {"kind": str(span.kind), "iteration": span.iteration, "batch_size": span.batch_size}
    return _Slice(span_name(span), _us(span.start_s), _us(span.end_s), _known(args))


def _sample_slice(s: SampleRecord) -> _Slice | None:
    if s.gen_end_s is None:
        return None
    start = s.gen_start_s if s.gen_start_s is not None else s.dispatch_s
    args = {
        "sample_id": s.sample_id, "prompt_id": s.prompt_id, "group_id": s.group_id,
        "iteration": s.iteration, "prompt_tokens": s.prompt_tokens,
        "output_tokens": s.output_tokens, "dispatch_s": s.dispatch_s,
        "version_start": s.version_start, "version_end": s.version_end,
        "version_prompt": s.version_prompt, "train_step": s.train_step, "reward": s.reward,
    }  # fmt: skip
    return _Slice(f"sample {s.sample_id}", _us(start), _us(s.gen_end_s), _known(args))


def _step_slice(step: dict[str, Any]) -> _Slice | None:
    if step.get("start_s") is None or step.get("end_s") is None:
        return None
    keys = ("num_samples", "num_tokens", "loss", "mean_reward", "mean_lag", "busy_s")
    args = _known({k: step.get(k) for k in keys} | {"version": step["step"] + 1})
    return _Slice(f"step {step['step']}", _us(step["start_s"]), _us(step["end_s"]), args)


def _fits(stack: list[int], sl: _Slice, nested: bool) -> bool:
    """Whether ``sl`` may go on a lane whose open slices end at ``stack`` (closing those
    that end before it starts)."""
    while stack and stack[-1] <= sl.start_us:
        stack.pop()
    return not stack or (nested and stack[-1] >= sl.end_us)


def pack_lanes(slices: Iterable[_Slice], nested: bool) -> list[list[_Slice]]:
    """Slices in as few lanes as keep each lane valid: in every lane two slices are
    disjoint or (with ``nested``) one contains the other. Each lane is in time order."""
    if not nested:
        return _disjoint_lanes(slices)
    lanes: list[list[_Slice]] = []
    stacks: list[list[int]] = []  # per lane: end times of the slices still open
    for sl in sorted(slices, key=lambda x: (x.start_us, -x.end_us)):
        index = next((i for i, stack in enumerate(stacks) if _fits(stack, sl, nested)), None)
        if index is None:
            lanes.append([])
            stacks.append([])
            index = len(lanes) - 1
        lanes[index].append(sl)
        stacks[index].append(sl.end_us)
    return lanes


def _disjoint_lanes(slices: Iterable[_Slice]) -> list[list[_Slice]]:
    """Interval partitioning: each slice to the free lane that freed first (a heap of
    lane end times), a new lane when none is free."""
    lanes: list[list[_Slice]] = []
    free: list[tuple[int, int]] = []  # (end of its last slice, lane)
    for sl in sorted(slices, key=lambda x: (x.start_us, x.end_us)):
        if free and free[0][0] <= sl.start_us:
            _, index = heapq.heappop(free)
        else:
            index = len(lanes)
            lanes.append([])
        lanes[index].append(sl)
        heapq.heappush(free, (sl.end_us, index))
    return lanes


def _meta(name: str, pid: int, tid: int, value: Any) -> dict[str, Any]:
    key = "sort_index" if name.endswith("sort_index") else "name"
    return {"ph": "M", "name": name, "pid": pid, "tid": tid, "ts": 0, "args": {key: value}}


def _thread(pid: int, tid: int, track: _Track) -> list[dict[str, Any]]:
    events = [
        _meta("thread_name", pid, tid, track.name),
        _meta("thread_sort_index", pid, tid, tid),
    ]
    for sl in track.slices:
        events.append(
            {"ph": "X", "name": sl.name, "cat": track.category, "pid": pid, "tid": tid,
             "ts": sl.start_us, "dur": sl.end_us - sl.start_us, "args": sl.args}
        )  # fmt: skip
    return events


@dataclass(frozen=True, slots=True)
class _Track:
    name: str
    category: str  # span, sample or step
    slices: list[_Slice]


def _tracks(name: str, own: list[_Slice], extra: list[_Slice]) -> list[_Track]:
    """A resource's own lanes (at least one), then its sample or step lanes."""
    lanes = pack_lanes(own, nested=True) or [[]]
    tracks = [_Track(name if i == 0 else f"{name} · lane {i}", "span", lane)
              for i, lane in enumerate(lanes)]  # fmt: skip
    label = STEP_LANE if name == TRAINER else SAMPLE_LANE
    category = "step" if name == TRAINER else "sample"
    for i, lane in enumerate(pack_lanes(extra, nested=False)):
        tracks.append(_Track(f"{label} {i}", category, lane))
    return tracks


def trace_events(
    spans: Sequence[Span],
    samples: Sequence[SampleRecord] = (),
    steps: Sequence[dict[str, Any]] = (),
) -> list[dict[str, Any]]:
    """Every trace event of a run: metadata naming each track, then its complete events."""
    by_resource: dict[str, list[_Slice]] = {}
    for sp in spans:
        by_resource.setdefault(sp.resource, []).append(_span_slice(sp))
    by_instance: dict[str, list[_Slice]] = {}
    for s in samples:
        sl = _sample_slice(s)
        if sl is not None:
            by_instance.setdefault(f"gen-{s.instance_id}", []).append(sl)
    step_slices = [sl for sl in map(_step_slice, steps) if sl is not None]
    names = set(by_resource) | set(by_instance) | ({TRAINER} if step_slices else set())
    events: list[dict[str, Any]] = []
    for pid, name in enumerate(sorted(names, key=_resource_order), start=1):
        events += [_meta("process_name", pid, 1, name), _meta("process_sort_index", pid, 1, pid)]
        extra = step_slices if name == TRAINER else by_instance.get(name, [])
        for tid, track in enumerate(_tracks(name, by_resource.get(name, []), extra), start=1):
            events += _thread(pid, tid, track)
    return events


CPU_PROCESS = "host cpu"
CPU_COUNTER = "cores used"


def cpu_roles(columns: Iterable[str]) -> list[str]:
    """The role columns of a CPU timeline (``cpu_timeline.csv``): all but its times and total."""
    return [c for c in columns if c not in ("start_s", "end_s", "total")]


def cpu_events(rows: Sequence[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    """A live run's CPU timeline (``cpu_timeline.csv``) as one counter of the ``host cpu``
    process: the cores each role used, from each interval's start (the last interval's
    end sets every role to 0)."""
    if not rows:
        return []
    roles = cpu_roles(rows[0])
    points = [(row["start_s"], {r: row[r] for r in roles}) for row in rows]
    points.append((rows[-1]["end_s"], dict.fromkeys(roles, 0)))
    counter = {"ph": "C", "name": CPU_COUNTER, "pid": pid, "tid": 1}
    return [
        _meta("process_name", pid, 1, CPU_PROCESS),
        _meta("process_sort_index", pid, 1, pid),
        *({**counter, "ts": _us(t), "args": args} for t, args in points),
    ]


def trace_json(
    spans: Sequence[Span],
    samples: Sequence[SampleRecord] = (),
    steps: Sequence[dict[str, Any]] = (),
    metadata: dict[str, Any] | None = None,
    cpu: Sequence[dict[str, Any]] = (),
) -> bytes:
    """The ``trace.json`` document (JSON object format, compact); ``cpu``: a live run's CPU
    timeline, as the last process's counter."""
    events = trace_events(spans, samples, steps)
    last_pid = max((e["pid"] for e in events), default=0)
    doc = {
        "traceEvents": events + cpu_events(cpu, last_pid + 1),
        "displayTimeUnit": "ms",
        "otherData": metadata or {},
    }
    return json.dumps(doc, separators=(",", ":"), allow_nan=False, check_circular=False).encode()
