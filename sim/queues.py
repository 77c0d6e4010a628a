"""The two request queues of a simulated vLLM scheduler, in vLLM's orders
(``vllm/v1/core/sched/request_queue.py`` and ``Scheduler.schedule``'s preemption).

* :class:`WaitingQueue`: ``priority`` orders by (priority, arrival) — a preempted request
  goes back by its own priority (``PriorityRequestQueue``); ``fcfs`` serves arrivals in
  order and puts a preempted request back at the front (``FCFSRequestQueue.prepend_request``).
* :class:`Victims`: who is preempted when a running request needs blocks: ``priority``
  takes the largest (priority, arrival) running request, ``fcfs`` the last admitted.
"""

from __future__ import annotations

import heapq
import itertools

from sim.sequence import Seq, SeqStatus


class WaitingQueue:
    def __init__(self, policy: str) -> None:
        self.policy = policy
        self._heap: list[tuple[tuple, int, Seq]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, seq: Seq) -> None:
        if self.policy == "priority":
            key: tuple = (seq.priority, seq.arrival)
        elif seq.num_preemptions:  # fcfs: the last preempted first
            key = (0, -next(self._order))
        else:
            key = (1, seq.arrival)
        seq.status = SeqStatus.WAITING
        heapq.heappush(self._heap, (key, next(self._order), seq))

    def head(self) -> Seq:
        return self._heap[0][2]

    def pop(self) -> Seq:
        return heapq.heappop(self._heap)[2]


class Victims:
    """Preemption order over ``running`` (admission-ordered), kept as a lazy heap."""

    def __init__(self, policy: str, running: dict[Seq, None]) -> None:
        self.policy = policy
        self.running = running
        self._heap: list[tuple[float, int, int, Seq]] = []  # max (priority, arrival) first

    def admitted(self, seq: Seq) -> None:
        if self.policy == "priority":
            heapq.heappush(self._heap, (-seq.priority, -seq.arrival, seq.admit_index, seq))

    def next(self) -> Seq:
        if self.policy != "priority":
            return next(reversed(self.running))
        while True:
            *_, index, seq = self._heap[0]
            if seq in self.running and seq.admit_index == index:
                return seq
            heapq.heappop(self._heap)  # left the running set since
