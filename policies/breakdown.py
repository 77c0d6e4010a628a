"""Where each optimizer step's time went (``steps.json``, sim and live alike).

A step's window runs from the previous step's end (the run's start, 0, for the first) to
its own end (``done_s`` where the executor recorded when it had finished with the step,
checkpoint and reports included; else ``end_s``). The trainer's timeline over the window
is split without overlap, in this order of precedence: pushing weights (``weight_sync``
spans of the trainer), a colocated context switch beyond its push, training (``train``
spans), and waiting (no trainer span: the trainer had nothing to do). Training and
waiting are split further with what the executor measures inside each step: the
optimizer step (live and simulated), the gradient all-reduce's exposed part (simulated
only: ``grad_sync_s``, which opens the simulated optimizer job, ``sim.trainer``; a live
trainer's all-reduce is not timed apart and sits in its ``train_s`` and ``optimizer_s``)
and, live only, the checkpoint (inside its train span) and the bookkeeping (its hooks,
inside the span; tracking and progress reports, after it). Beside the partition,
two overlapping figures: the time any generation instance was generating, and the mean
time an instance was paused for a weight update (``pause_s``: the mean over instances, not
their sum; the run log's per-step "pause ... s per instance" and the trackers'
``time/pause_s`` are this figure, ``policies.tracking.StepReport.pause_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from policies.intervals import Interval, Measure, merged, minus
from policies.records import Span, SpanKind
from policies.resources import TRAINER, is_generation

INSIDE = ("optimizer_s", "grad_sync_s", "checkpoint_s", "hooks_s")  # in a step's train span


@dataclass(frozen=True, slots=True)
class StepBreakdown:
    window_s: float  # previous step's end (or the run's start) to this step's end
    train_s: float  # forward and backward passes (the trainer's train spans, less the below)
    optimizer_s: float  # the optimizer step itself
    grad_sync_s: float  # the gradient all-reduce's exposed part (simulated; 0 live)
    checkpoint_s: float
    bookkeeping_s: float  # the executor's hooks after a step, tracking and progress
    push_s: float  # the trainer pushing weights
    switch_s: float  # colocated context switches, beyond their push
    wait_s: float  # the trainer idle: waiting for samples
    generate_s: float  # some generation instance generating (overlaps the above)
    pause_s: float  # mean over instances of their weight-update pauses


def _intervals(spans: Sequence[Span], kind: SpanKind, resource: str) -> list[Interval]:
    return merged((s.start_s, s.end_s) for s in spans if s.kind == kind and s.resource == resource)


def step_breakdowns(spans: Sequence[Span], steps: Sequence[dict[str, Any]]) -> list[StepBreakdown]:
    """One breakdown per entry of ``steps``, in order (each with ``end_s``; ``done_s``,
    ``optimizer_s``, ``grad_sync_s``, ``checkpoint_s``, ``hooks_s`` and ``report_s`` where
    measured)."""
    push = _intervals(spans, SpanKind.WEIGHT_SYNC, TRAINER)
    switch = minus(_intervals(spans, SpanKind.CONTEXT_SWITCH, TRAINER), push)
    train = minus(minus(_intervals(spans, SpanKind.TRAIN, TRAINER), push), switch)
    measures = {name: Measure(iv) for name, iv in (("push", push), ("switch", switch), ("train", train))}  # fmt: skip
    generating = merged(
        (s.start_s, s.end_s)
        for s in spans
        if is_generation(s.resource) and s.kind in (SpanKind.PREFILL, SpanKind.DECODE)
    )
    gen = Measure(generating)
    instances = sorted({s.resource for s in spans if is_generation(s.resource)})
    pauses = [Measure(_intervals(spans, SpanKind.WEIGHT_SYNC, r)) for r in instances]
    out, previous = [], 0.0
    for step in steps:
        end = float(step.get("done_s") or step["end_s"])
        lo = min(previous, end)
        parts = {name: m.within(lo, end) for name, m in measures.items()}
        inside = {k: float(step.get(k) or 0.0) for k in INSIDE}
        scale = min(1.0, parts["train"] / sum(inside.values())) if sum(inside.values()) else 0.0
        idle = max(0.0, end - lo - parts["push"] - parts["switch"] - parts["train"])
        report = min(idle, float(step.get("report_s") or 0.0))
        out.append(
            StepBreakdown(
                window_s=end - lo,
                train_s=parts["train"] - scale * sum(inside.values()),
                optimizer_s=scale * inside["optimizer_s"],
                grad_sync_s=scale * inside["grad_sync_s"],
                checkpoint_s=scale * inside["checkpoint_s"],
                bookkeeping_s=scale * inside["hooks_s"] + report,
                push_s=parts["push"],
                switch_s=parts["switch"],
                wait_s=idle - report,
                generate_s=gen.within(lo, end),
                pause_s=sum(m.within(lo, end) for m in pauses) / len(pauses) if pauses else 0.0,
            )
        )
        previous = end
    return out


def with_breakdown(steps: Sequence[dict[str, Any]], spans: Sequence[Span]) -> list[dict[str, Any]]:
    """``steps`` with each step's breakdown added under ``breakdown``."""
    found = step_breakdowns(spans, steps)
    return [{**step, "breakdown": asdict(b)} for step, b in zip(steps, found)]
