"""Whether a server's engine still steps, seen from its HTTP frontend.

The frontend (vLLM's ``AsyncLLM``) hands each request to the engine-core process and gets
back one batch of outputs per engine step that ran requests, finished or not. An engine
core that hangs (a collective that never returns, a stopped process) leaves the frontend
answering ``/health`` as before while nothing it holds moves. :class:`EngineWatch` counts
those output batches (the stream's heartbeats, :mod:`runtime.batch_gen`) and notes when
the engine last stepped or took a request: an engine that holds requests and has done
neither for ``stall_s`` is stalled, and ``/health`` says so (503), so that a run takes
the server for lost (and restarts it, or sends its samples elsewhere) instead of waiting
on it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

STALL_ENV = "TANDEM_STALL_S"  # read by the server; default STALL_S
STALL_S = 60.0  # far above a step, a chunk of prefill, or a weight load


def stall_s_from_env() -> float:
    """``TANDEM_STALL_S`` as a positive number of seconds (default ``STALL_S``)."""
    raw = os.environ.get(STALL_ENV) or str(STALL_S)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{STALL_ENV}={raw!r}: expected seconds > 0") from None
    if not value > 0:
        raise ValueError(f"{STALL_ENV}={raw!r}: expected seconds > 0")
    return value


class EngineWatch:
    """Counts the engine's steps and tells how long it has held requests without one."""

    def __init__(
        self, engine, stall_s: float = STALL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.steps = 0
        self.stall_s = stall_s
        self._clock = clock
        self._last = clock()  # the last step, request taken, or pause's end
        self._stall: tuple[int, float] | None = None  # a stall seen: (steps then, since)
        processor = getattr(engine, "output_processor", None)
        self._unfinished = getattr(processor, "get_num_unfinished_requests", lambda: 0)
        if processor is not None:
            stepped = processor.process_outputs

            def counted(*args, **kwargs):
                self.steps += 1
                self._last = self._clock()
                return stepped(*args, **kwargs)

            processor.process_outputs = counted
        add = getattr(engine, "add_request", None)
        if add is not None:

            async def add_request(*args, **kwargs):
                self._last = self._clock()  # a request waits: the clock starts again
                return await add(*args, **kwargs)

            engine.add_request = add_request
        abort = getattr(engine, "abort", None)
        if abort is not None:

            async def abort_requests(*args, **kwargs):
                self.stalled_for()  # a stall seen here outlasts the requests it held
                return await abort(*args, **kwargs)

            engine.abort = abort_requests

    def touch(self) -> None:
        """The engine had reason not to step until now (a pause it answered ended)."""
        self._last, self._stall = self._clock(), None

    def stalled_for(self) -> float | None:
        """Seconds the engine has held requests without stepping, if ``stall_s`` or more;
        None while it steps or holds none. A stall once seen lasts until the engine steps
        (or answers a pause): a client that gave up on it took its requests away, not the
        hang."""
        now = self._clock()
        if self._stall is not None and self._stall[0] == self.steps:
            return now - self._stall[1]
        if not self._unfinished() or now - self._last < self.stall_s:
            return None
        self._stall = (self.steps, self._last)
        return now - self._last
