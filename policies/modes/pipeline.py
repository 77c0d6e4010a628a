"""``pipeline`` mode (PipelineRL): generation never stops for training.

Instances keep up to ``max_num_seqs`` sequences running; the trainer takes an
optimizer step every ``batch_size`` finished samples and pushes the new weights at
once (or every ``push_every`` steps), loaded in flight (``keep``: pause, load, resume
with KV cache kept; ``abort-resubmit``: running requests start again on the new weights,
their decoded tokens thrown away, counted in ``aborted_requests`` and ``discarded_tokens``,
and a resubmitted sample's staleness is from its new start; ``drain``). ``max_lag``
bounds staleness exactly through the :class:`~policies.modes.lag.LagBudget`, counted in
whole groups: a group (the ``group_size`` samples of one prompt, needed together for
GRPO's group-mean advantage) is placed into one optimizer step once all its samples
finished, with the deadline of its oldest sample.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from policies.modes.base import Controller, register_mode
from policies.modes.events import (
    Command,
    Finish,
    InstanceAdded,
    InstanceLost,
    PushWeights,
    RequestsAborted,
    SampleFinished,
    Start,
    TrainStepDone,
    WeightsLoaded,
)
from policies.modes.lag import LagBudget
from policies.records import Completion, Request


@dataclass(order=True, slots=True)
class _ReadyGroup:
    """A finished group waiting for a step, in the ready heap: earliest deadline first,
    then the earliest finished, then by group id (unique, so samples never compare)."""

    version: int  # the group's counted start version: its deadline is version + max_lag
    finished_s: float
    group_id: int
    samples: list[Completion] = field(compare=False)


@register_mode("pipeline", streaming=True, continuous=True)
class PipelineController(Controller):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.budget = LagBudget(
            self.config.batch_size // self.config.group_size, self.config.max_lag
        )
        self._pending: deque[Request] = deque()  # prompts fetched, not yet dispatched
        self._next_iteration = 0
        self._num_started = 0
        self._counted_version: dict[int, int] = {}  # group id -> version counted in the budget
        self._finished: dict[int, list[Completion]] = {}  # group id -> its finished samples
        self._ready: list[_ReadyGroup] = []  # heap of whole finished groups
        self._handlers = {
            Start: self._on_start,
            SampleFinished: self._on_sample,
            TrainStepDone: self._on_step_done,
            WeightsLoaded: self._on_loaded,
            RequestsAborted: self._on_aborted,
            InstanceAdded: self._on_added,
            InstanceLost: self._on_lost,
        }

    @property
    def _total_samples(self) -> int:
        return self.config.num_steps * self.config.batch_size

    # -- handlers ----------------------------------------------------------------------

    def _on_start(self, event: Start) -> list[Command]:
        return self._fill()

    def _on_sample(self, event: SampleFinished) -> list[Command]:
        c = self._note_finished(event)
        group = self._finished.setdefault(c.request.group_id, [])
        group.append(c)
        if len(group) < self.config.group_size:
            return self._fill()
        del self._finished[c.request.group_id]
        counted = self._counted_version.pop(c.request.group_id)
        oldest = min(m.version_start for m in group)
        self.budget.retarget(counted, max(counted, oldest))
        ready = _ReadyGroup(max(counted, oldest), event.time_s, c.request.group_id, group)
        heapq.heappush(self._ready, ready)
        return self._place_ready() + self._fill()

    def _on_step_done(self, event: TrainStepDone) -> list[Command]:
        self.latest_version = event.stats.step + 1
        if self.latest_version >= self.config.num_steps:
            self.finished = True
            return [Finish()]
        if self.latest_version % self.config.push_every:
            return self._fill()  # servers keep the older weights; the lag budget counts them
        return [PushWeights(self.latest_version, self.config.inflight)]

    def _on_loaded(self, event: WeightsLoaded) -> list[Command]:
        self._on_weights_loaded(event)
        return self._fill()

    def _on_aborted(self, event: RequestsAborted) -> list[Command]:
        """Dispatch aborted requests again; their group keeps its (older) counted version."""
        for r in event.requests:
            view = self.views[event.instance_id]
            view.num_assigned -= 1
            view.assigned_tokens -= r.predicted_tokens or 0.0
        return self._dispatch_to(list(event.requests), self._resubmit_views())

    def _on_lost(self, event: InstanceLost) -> list[Command]:
        """Its requests go to the others (their groups keep their counted versions); with
        one instance fewer, fewer groups start."""
        return self._on_instance_lost(event) + self._fill()

    def _resubmit_views(self) -> list:
        return self._open_views() or self._all_views()

    def _on_added(self, event: InstanceAdded) -> list[Command]:
        self._on_instance_added(event)
        return self._fill()

    # -- steps -------------------------------------------------------------------------

    def _all_views(self) -> list:
        return list(self.views.values())

    def _open_views(self) -> list:
        return [v for v in self.views.values() if v.num_free_slots > 0]

    def _min_version(self) -> int:
        return min(v.version for v in self.views.values())

    def _next_group(self) -> list[Request]:
        if not self._pending:
            self._pending.extend(self._prompts.batch(self._next_iteration))
            self._next_iteration += 1
        group_id = self._pending[0].group_id
        group = []
        while self._pending and self._pending[0].group_id == group_id:
            group.append(self._pending.popleft())
        return group

    def _fill(self) -> list[Command]:
        """Start groups while slots are free and the lag budget allows; dispatch them at once."""
        free = sum(v.num_free_slots for v in self.views.values())
        # a group waits for slots for all its samples, unless it is larger than the cluster
        need = min(self.config.group_size, sum(v.max_num_seqs for v in self.views.values()))
        version = self._min_version()
        batch: list[Request] = []
        while (
            not self.finished
            and self._num_started < self._total_samples
            and free >= need
            and self.budget.can_start(version)
        ):
            group = self._next_group()
            self.budget.start(version)
            self._counted_version[group[0].group_id] = version
            self._num_started += len(group)
            free -= len(group)
            batch += group
        if not batch:
            return []
        return self._dispatch_to(self._predict(batch), self._open_views())

    def _place_ready(self) -> list[Command]:
        """Place finished groups earliest-deadline-first while the budget allows."""
        out: list[Command] = []
        while self._ready and self.budget.can_place(self._ready[0].version):
            ready = heapq.heappop(self._ready)
            step = self.budget.step
            for c in ready.samples:
                out += self._train(step, c)
            if self.budget.place(ready.version):
                out += self._close_step(step)
        return out
