"""What a live run records: one :class:`SampleRecord` per sample, :class:`Span` per activity.

A generation instance counts as busy (``decode``) while at least one of its requests is
outstanding: the server is a continuous-batching black box, so prefill is not separated.
"""

from __future__ import annotations

from dataclasses import replace

from policies.records import Completion, Request, SampleRecord, Span, SpanKind


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

    def restore(self, samples: list[SampleRecord], spans: list[Span], steps: list[dict]) -> None:
        self.samples = {s.sample_id: s for s in samples}
        self.spans = list(spans)
        self.steps = list(steps)

    def outstanding(self, instance_id: int) -> int:
        return self._outstanding.get(instance_id, 0)

    def sent(self, instance_id: int, now_s: float) -> None:
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
                Span(f"gen-{instance_id}", SpanKind.DECODE, start, now_s, iteration, batch)
            )

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

    def span(self, resource: str, kind: SpanKind, start_s: float, end_s: float, **kw) -> None:
        self.spans.append(Span(resource, kind, start_s, end_s, **kw))

    def trained_samples(self) -> list[SampleRecord]:
        return [s for s in self.samples.values() if s.train_step is not None]
