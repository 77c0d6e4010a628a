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
                self.touch()
                return await add(*args, **kwargs)

            engine.add_request = add_request

    def touch(self) -> None:
        """The engine had reason not to step until now (a request came, a pause ended)."""
        self._last = self._clock()

    def stalled_for(self) -> float | None:
        """Seconds the engine has held requests without stepping, if ``stall_s`` or more;
        None while it steps or holds none."""
        if not self._unfinished():
            return None
        idle = self._clock() - self._last
        return idle if idle >= self.stall_s else None
