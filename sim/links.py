"""Links between datacenters: one weight push at a time per link, the newest first.

Modelling assumptions:

* A cross-datacenter link (``link-<a>-<b>``) carries one push at a time at its full
  bandwidth (a SimPy ``Resource`` of capacity 1, FIFO), so two pushes never share its
  bandwidth and a second waits for the first to be through.
* A push still waiting for its link when a newer version is pushed over the same link is
  dropped, never sent: its receivers would replace it on arrival (a generation engine
  keeps only the newest pending update), and StreamRL sends the latest weights.
* One transfer over a link serves every instance behind it (the weights cross once and
  fan out inside the target datacenter): the link is held for the crossing and that
  fan-out, and its receivers get the weights when it is through. Until then they keep
  generating on the weights they have; a receiver that updates in flight pauses only to
  load them (before 2026-12-06 the weights were handed over as the crossing started, and
  such a receiver paused for the whole crossing: at 1 Gbit/s every instance behind the
  link stopped ~122 s a push). Pushes inside a datacenter are not queued here:
  one broadcast reaches all its instances at once, as the live runtime's single broadcast
  to all servers does, and an engine replaces an update still pending; its span
  (``link-<a>-<a>``) is recorded as it starts.

Known bias: the link is held for the transfer alone; a receiver that applies the update
late (``drain``) pauses later than the link is busy.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, replace

import simpy

from policies.records import Span, SpanKind
from sim.ticks import to_seconds, to_ticks


@dataclass(frozen=True, slots=True)
class LinkPush:
    """One version's weights over one link, handed to its receivers when it is through."""

    link: str  # resource name, ``link-<a>-<b>``
    version: int
    transfer_s: float
    deliver: Callable[[], None]  # hands the weights to the receivers behind the link


class Links:
    """The cross-datacenter links of a run, each a FIFO queue of pushes."""

    def __init__(self, env: simpy.Environment, on_span: Callable[[Span], None]) -> None:
        self.env = env
        self._on_span = on_span
        self._queues: dict[str, simpy.Resource] = {}
        self._newest: dict[str, int] = {}  # link -> newest version pushed over it

    def send(self, push: LinkPush) -> None:
        """Send ``push`` over its link, at once if the link is free, else when the pushes
        ahead are through (dropped if a newer push comes first); ``push.deliver`` when it
        is through."""
        self._newest[push.link] = push.version
        queue = self._queues.setdefault(push.link, simpy.Resource(self.env, capacity=1))
        request = queue.request()
        if request.triggered:  # the link is free: the push starts now
            self._note(push)
            self.env.process(self._through(queue, request, push))
        else:
            self.env.process(self._wait(queue, request, push))

    def _wait(
        self, queue: simpy.Resource, request: simpy.Event, push: LinkPush
    ) -> Generator[simpy.Event, None, None]:
        yield request
        if self._newest[push.link] != push.version:  # a newer push made it obsolete
            queue.release(request)
            return
        self._note(push)
        yield from self._through(queue, request, push)

    def _through(
        self, queue: simpy.Resource, request: simpy.Event, push: LinkPush
    ) -> Generator[simpy.Event, None, None]:
        yield self.env.timeout(to_ticks(push.transfer_s))
        queue.release(request)
        push.deliver()

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


def cut_at(spans: list[Span], end_s: float) -> list[Span]:
    """The spans of a run that ended at ``end_s``, a push still on its link then cut there
    (a span is recorded as it starts, with the end its transfer will reach)."""
    return [replace(s, end_s=end_s) if s.end_s > end_s else s for s in spans]
