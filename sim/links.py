"""Links between datacenters: one weight push at a time per link, the newest first.

Modelling assumptions:

* A cross-datacenter link (``link-<a>-<b>``) carries one push at a time at its full
  bandwidth (a SimPy ``Resource`` of capacity 1, FIFO), so two pushes never share its
  bandwidth and a second waits for the first to be through.
* A push still waiting for its link when a newer version is pushed over the same link is
  dropped, never sent: its receivers would replace it on arrival (a generation engine
  keeps only the newest pending update), and StreamRL sends the latest weights.
* One transfer over a link serves every instance behind it (the weights cross once and
  fan out inside the target datacenter). Pushes inside a datacenter are not queued here:
  one broadcast reaches all its instances at once, as the live runtime's single broadcast
  to all servers does, and an engine replaces an update still pending; its span
  (``link-<a>-<a>``) is recorded as it starts.

Known bias: the link is held for the transfer alone; a receiver that applies the update
late (``drain``) pauses later than the link is busy.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import simpy

from policies.records import Span, SpanKind
from sim.ticks import to_seconds, to_ticks


@dataclass(frozen=True, slots=True)
class LinkPush:
    """One version's weights over one link, handed to its receivers when it starts."""

    link: str  # resource name, ``link-<a>-<b>``
    version: int
    transfer_s: float
    deliver: Callable[[], None]  # starts the receivers' transfer if it had to wait


class Links:
    """The cross-datacenter links of a run, each a FIFO queue of pushes."""

    def __init__(self, env: simpy.Environment, on_span: Callable[[Span], None]) -> None:
        self.env = env
        self._on_span = on_span
        self._queues: dict[str, simpy.Resource] = {}
        self._newest: dict[str, int] = {}  # link -> newest version pushed over it

    def send(self, push: LinkPush) -> bool:
        """Start ``push`` now if its link is free (True: the caller delivers it at once),
        else later, calling ``push.deliver`` when the pushes ahead are through."""
        self._newest[push.link] = push.version
        queue = self._queues.setdefault(push.link, simpy.Resource(self.env, capacity=1))
        request = queue.request()
        if not request.triggered:
            self.env.process(self._wait(queue, request, push))
            return False
        self._note(push)
        self.env.process(self._hold(queue, request, to_ticks(push.transfer_s)))
        return True

    def _wait(
        self, queue: simpy.Resource, request: simpy.Event, push: LinkPush
    ) -> Generator[simpy.Event, None, None]:
        yield request
        if self._newest[push.link] != push.version:  # a newer push made it obsolete
            queue.release(request)
            return
        self._note(push)
        push.deliver()
        yield from self._hold(queue, request, to_ticks(push.transfer_s))

    def _hold(
        self, queue: simpy.Resource, request: simpy.Event, ticks: int
    ) -> Generator[simpy.Event, None, None]:
        yield self.env.timeout(ticks)
        queue.release(request)

    def note_broadcast(self, link: str, version: int, transfer_s: float) -> None:
        """The span of a broadcast inside one datacenter (``link-<a>-<a>``), never queued."""
        start_s = to_seconds(self.env.now)
        self._on_span(
            Span(link, SpanKind.WEIGHT_SYNC, start_s, start_s + transfer_s, version - 1, None)
        )

    def _note(self, push: LinkPush) -> None:
        """The link's span; a transfer carries the step whose weights it moves."""
        start_s = to_seconds(self.env.now)
        end_s = to_seconds(self.env.now + to_ticks(push.transfer_s))  # as the link is held
        self._on_span(Span(push.link, SpanKind.WEIGHT_SYNC, start_s, end_s, push.version - 1, None))
