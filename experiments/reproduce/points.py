"""Simulated points of a reproduction study (run in parallel by :mod:`.workers`).

A :class:`Point` is a shipped config plus overrides; :func:`run_one` simulates it and
returns a :class:`PointResult`: the run's metrics plus the few per-step and per-sample
summaries the figures need, extracted in the worker so that no large result crosses
process boundaries.
"""

from __future__ import annotations

import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from experiments.specs import config_path
from policies.records import SpanKind
from policies.resources import is_link
from policies.results import RunResult
from policies.spec import RunSpec, load_spec


@dataclass(frozen=True, slots=True)
class Point:
    """One simulation: a shipped config name and ``key.path=value`` overrides."""

    config: str
    overrides: tuple[str, ...]

    def spec(self) -> RunSpec:
        return load_spec(config_path(self.config), list(self.overrides))


@dataclass(frozen=True, slots=True)
class IterationRow:
    """What one iteration (= one optimizer step in wave modes) looked like."""

    iteration: int
    max_output_tokens: int  # longest output generated in the iteration
    num_instances: int  # generation instances that served it
    generation_s: float  # first dispatch to last completion
    train_busy_s: float  # trainer busy time of the step


@dataclass(slots=True)
class PointResult:
    point: Point
    metrics: dict[str, Any]
    gen_gpus: int
    train_gpus: int
    iterations: list[IterationRow] = field(default_factory=list)
    step_end_s: list[float] = field(default_factory=list)
    staleness: dict[int, int] = field(default_factory=dict)  # lag -> trained samples
    cross_dc_sync_s: float = 0.0  # summed weight-transfer time over inter-datacenter links
    cross_dc_pushes: int = 0  # weight pushes that crossed datacenters
    error: str | None = None


def summarize(point: Point, result: RunResult) -> PointResult:
    """Extract what the figures need from a full run result."""
    cluster = result.spec.cluster
    return PointResult(
        point=point,
        metrics=dict(result.metrics),
        gen_gpus=sum(p.num_gpus for p in cluster.generation),
        train_gpus=cluster.trainer.num_gpus,
        iterations=_iteration_rows(result),
        step_end_s=[float(s["end_s"]) for s in result.steps],
        staleness=_staleness(result),
        cross_dc_sync_s=sum(_cross_dc_syncs(result)),
        cross_dc_pushes=len(_cross_dc_syncs(result)),
    )


def _iteration_rows(result: RunResult) -> list[IterationRow]:
    lo: dict[int, float] = {}
    hi: dict[int, float] = {}
    longest: Counter[int] = Counter()
    instances: dict[int, set[int]] = {}
    for s in result.samples:
        if s.gen_end_s is None:
            continue
        it = s.iteration
        lo[it] = min(lo.get(it, s.dispatch_s), s.dispatch_s)
        hi[it] = max(hi.get(it, s.gen_end_s), s.gen_end_s)
        longest[it] = max(longest[it], s.output_tokens)
        instances.setdefault(it, set()).add(s.instance_id)
    busy = {int(s["step"]): float(s.get("busy_s", s["end_s"] - s["start_s"])) for s in result.steps}
    return [
        IterationRow(it, longest[it], len(instances[it]), hi[it] - lo[it], busy.get(it, 0.0))
        for it in sorted(lo)
    ]


def _staleness(result: RunResult) -> dict[int, int]:
    lags = Counter(s.staleness for s in result.samples if s.staleness is not None)
    return dict(sorted(lags.items()))


def _cross_dc_syncs(result: RunResult) -> list[float]:
    """Durations of the weight pushes that crossed from one datacenter to another (not one
    still crossing when the run ended: its span is cut there)."""
    out = []
    for span in result.spans:
        if span.kind != SpanKind.WEIGHT_SYNC or not is_link(span.resource):
            continue
        _, src, dst = span.resource.split("-", 2)
        if src != dst and span.end_s < result.metrics["makespan_s"]:
            out.append(span.end_s - span.start_s)
    return out


def run_one(point: Point) -> PointResult:
    """Simulate one point; a failure becomes a result with its error, never an exception."""
    from experiments.runs import simulate

    try:
        return summarize(point, simulate(point.spec()))
    except Exception as err:  # noqa: BLE001 - one failing point must not lose the others
        message = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
        return PointResult(point, {}, 0, 0, error=message)
