"""What a live run records: one :class:`SampleRecord` per sample, :class:`Span` per activity,
one :class:`Fault` per server lost or restarted.

A generation instance counts as busy (``decode``) while at least one of its requests is
outstanding: the server is a continuous-batching black box, so prefill is not separated.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from policies.records import Completion, Request, SampleRecord, Span, SpanKind, StepStats
from policies.resources import generation_resource
from policies.tracking import StepUpdate


@dataclass(slots=True, frozen=True)
class Fault:
    """A server lost, restarted, added, rejoined or retired (``faults.json`` of the run
    directory)."""

    time_s: float
    instance_id: int
    # lost | retried | restarted | restart-failed | added | add-failed | rejoined | retired
    event: str
    detail: str
    num_resubmitted: int = 0  # lost: its requests, dispatched again to the others; retried: to it
    version: int | None = None  # rejoined: the weight version it serves from then on


@dataclass(slots=True)
class DataPosition:
    """Where a live run's data stands at a checkpoint (saved with the trainer's weights):
    the next step, the run's clock, the samples trained so far, every span and step.
    ``journal``: a slim position whose history is in the journal beside the checkpoint
    (:mod:`runtime.history`); the same record also carries one journal line's delta."""

    next_step: int
    time_s: float
    samples: list[SampleRecord]
    spans: list[Span]
    steps: list[dict[str, Any]]
    journal: bool = False

    def to_dict(self) -> dict[str, Any]:
        """Plain values for the checkpoint file (no tandem class is pickled into it)."""
        return {
            "next_step": self.next_step,
            "time_s": self.time_s,
            "samples": [asdict(s) for s in self.samples],
            "spans": [{**asdict(s), "kind": str(s.kind)} for s in self.spans],
            "steps": list(self.steps),
            "journal": self.journal,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataPosition:
        return cls(
            next_step=data["next_step"],
            time_s=data["time_s"],
            samples=[SampleRecord(**s) for s in data["samples"]],
            spans=[Span(**{**s, "kind": SpanKind(s["kind"])}) for s in data["spans"]],
            steps=list(data["steps"]),
            journal=bool(data.get("journal", False)),
        )


class Recorder:
    def __init__(self, step_offset: int = 0) -> None:
        self.step_offset = step_offset  # a resumed run's first step
        self.iteration_of: dict[int, int] = {}  # sample id -> global iteration, if relabelled
        self.samples: dict[int, SampleRecord] = {}  # sample id -> record
        self.spans: list[Span] = []
        self.steps: list[dict] = []
        self._outstanding: dict[int, int] = {}  # instance id -> requests in flight
        self._busy_since: dict[int, float] = {}
        self._max_batch: dict[int, int] = {}
        self.faults: list[Fault] = []
        self.on_fault: Callable[[Fault], None] | None = None  # e.g. append to faults.json
        # called with True when the last request in flight on any server returns, with False
        # when one is sent while none was (a trainer borrows idle cores: runtime.core_loan)
        self.on_generation_idle: Callable[[bool], None] | None = None
        self._trained_in: dict[int, list[int]] = {}  # global step -> its sample ids
        self._spans_reported = 0  # spans already handed to a step update
        self._resumed_at_s: float | None = None  # a resumed run's clock at its checkpoint
        # what the history journal has (runtime.history): sample ids, spans, steps
        self._journaled: tuple[set[int], int, int] = (set(), 0, 0)

    @classmethod
    def resumed(cls, position: DataPosition) -> Recorder:
        """A recorder going on from a checkpoint's position."""
        recorder = cls(step_offset=position.next_step)
        recorder.samples = {s.sample_id: s for s in position.samples}
        recorder.spans = list(position.spans)
        recorder.steps = list(position.steps)
        recorder._spans_reported = len(recorder.spans)
        recorder._resumed_at_s = position.time_s
        recorder._journaled = (set(recorder.samples), len(recorder.spans), len(recorder.steps))
        return recorder

    def journal_delta(self, step: int, time_s: float) -> DataPosition:
        """What the history journal lacks after global ``step``: the samples trained up
        to it, the spans and steps recorded since the last delta (each given once). A
        server busy at ``time_s`` has its busy span cut there (:meth:`_cut_busy`)."""
        self._cut_busy(time_s)
        ids, num_spans, num_steps = self._journaled
        new = [
            s for s in self.trained_samples()
            if s.train_step <= step and s.sample_id not in ids  # type: ignore[operator]
        ]  # fmt: skip
        ids.update(s.sample_id for s in new)
        spans, steps = self.spans[num_spans:], self.steps[num_steps:]
        self._journaled = (ids, len(self.spans), len(self.steps))
        return DataPosition(step + 1, time_s, new, list(spans), list(steps))

    def _cut_busy(self, now_s: float) -> None:
        """End each open busy span at ``now_s`` and go on with a new one from there.

        A ``pipeline`` server stays busy from the run's start to its end: without the cut
        its one span would reach the journal only at the end, and a run stopped before it
        would resume with no generation before the checkpoint. The pieces carry no
        iteration (requests of several were running)."""
        for i, start in sorted(self._busy_since.items()):
            if start < now_s:
                batch = self._max_batch.get(i)
                self.spans.append(
                    Span(generation_resource(i), SpanKind.DECODE, start, now_s, None, batch)
                )
                self._busy_since[i], self._max_batch[i] = now_s, self._outstanding[i]

    def outstanding(self, instance_id: int) -> int:
        return self._outstanding.get(instance_id, 0)

    def sent(self, instance_id: int, now_s: float) -> None:
        if self.on_generation_idle is not None and not any(self._outstanding.values()):
            self.on_generation_idle(False)
        n = self._outstanding.get(instance_id, 0) + 1
        self._outstanding[instance_id] = n
        if n == 1:
            self._busy_since[instance_id] = now_s
        self._max_batch[instance_id] = max(self._max_batch.get(instance_id, 0), n)

    def returned(self, instance_id: int, now_s: float, iteration: int) -> None:
        self._outstanding[instance_id] -= 1
        if self._outstanding[instance_id] == 0:
            start = self._busy_since.pop(instance_id)
            batch = self._max_batch.pop(instance_id, None)
            self.spans.append(
                Span(
                    generation_resource(instance_id),
                    SpanKind.DECODE,
                    start,
                    now_s,
                    iteration,
                    batch,
                )
            )
            if self.on_generation_idle is not None and not any(self._outstanding.values()):
                self.on_generation_idle(True)

    def lost(self, instance_id: int, now_s: float, iteration: int | None) -> None:
        """The instance is gone with what it was running: its busy span ends now."""
        if self._outstanding.get(instance_id, 0) > 0:
            self._outstanding[instance_id] = 1
            self.returned(instance_id, now_s, iteration if iteration is not None else 0)

    def fault(self, fault: Fault) -> None:
        self.faults.append(fault)
        if self.on_fault is not None:
            self.on_fault(fault)

    def iteration(self, r: Request) -> int:
        """The request's own (global) iteration, whatever the controller numbered it."""
        return self.iteration_of.get(r.sample_id, r.iteration + self.step_offset)

    def completion(self, c: Completion) -> None:
        r = c.request
        self.samples[r.sample_id] = SampleRecord.from_completion(c, iteration=self.iteration(r))

    def trained(self, sample_ids: list[int], step: int) -> None:
        """``step`` is global; the sample is trained into version ``step + 1``... from ``step``."""
        for sid in sample_ids:
            self.samples[sid] = replace(self.samples[sid], train_step=step, version_trained=step)
        self._trained_in.setdefault(step, []).extend(sample_ids)

    def step_update(self, stats: StepStats, now_s: float, num_steps: int) -> StepUpdate:
        """What global step ``stats.step`` trained, the spans since the last update and
        the busy periods still open at ``now_s``."""
        samples = tuple(self.samples[sid] for sid in self._trained_in.pop(stats.step, []))
        spans, self._spans_reported = self.spans[self._spans_reported :], len(self.spans)
        open_spans = tuple(
            Span(generation_resource(i), SpanKind.DECODE, start, now_s)
            for i, start in sorted(self._busy_since.items())
        )
        start_s, self._resumed_at_s = self._resumed_at_s, None
        return StepUpdate(stats, samples, tuple(spans), open_spans, num_steps, start_s)

    def span(self, resource: str, kind: SpanKind, start_s: float, end_s: float, **kw) -> None:
        self.spans.append(Span(resource, kind, start_s, end_s, **kw))

    def trained_samples(self) -> list[SampleRecord]:
        return [s for s in self.samples.values() if s.train_step is not None]
