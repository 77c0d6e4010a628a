"""A generation server stopped on request ends its log without a crash's traceback.

At a stop (SIGTERM to the server's process group, as :func:`runtime.procs.stop_server`
sends it, or Ctrl-C at a terminal) vLLM's API server shuts its engine client down: it
kills the engine core, closes the sockets to it (which hands ``EngineDeadError`` to
whoever reads its outputs) and only then cancels its own output handler. When the
handler reads first, it logs ``AsyncLLM output_handler failed.`` with an
``EngineDeadError`` traceback: 5 of 6 stops here, a clean stop whose log reads as a
crash. Waiting for the engine to drain (``shutdown_timeout``) only adds seconds a stop.

So the server's event loop notes that it handled a stop signal (:class:`StopNotingLoop`),
and from then on that one record, an ``EngineDeadError`` of the output handler, is left
out of the log (:class:`EngineDeadAtStop`); the stop itself is unchanged. An engine that
dies while the server serves still logs its traceback.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
OUTPUT_HANDLER_LOGGER = "vllm.v1.engine.async_llm"  # logs the output handler's failure


class StopNotingLoop(asyncio.SelectorEventLoop):
    """An event loop whose ``stopping`` turns True once it has handled SIGINT or SIGTERM
    (the handlers vLLM's API server registers run as before)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def add_signal_handler(self, sig: int, callback: Callable[..., Any], *args: Any) -> None:
        if sig not in STOP_SIGNALS:
            return super().add_signal_handler(sig, callback, *args)

        def noted(*cb_args: Any) -> None:
            self.stopping = True
            callback(*cb_args)

        return super().add_signal_handler(sig, noted, *args)


class EngineDeadAtStop(logging.Filter):
    """Leaves out a record whose exception is ``dead`` (vLLM's ``EngineDeadError``) once
    ``stopping()`` says the server is stopping on request."""

    def __init__(self, dead: type[BaseException], stopping: Callable[[], bool]) -> None:
        super().__init__()
        self.dead = dead
        self.stopping = stopping

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, self.dead) and self.stopping())


def quiet_engine_dead_at_stop(loop: asyncio.AbstractEventLoop) -> None:
    """In the server process, once vLLM is imported: leave the output handler's
    ``EngineDeadError`` out of the log after ``loop`` (a :class:`StopNotingLoop`) handled a
    stop signal. Any other loop: nothing changes."""
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(loop, StopNotingLoop):
        stopping = EngineDeadAtStop(EngineDeadError, lambda: loop.stopping)
        logging.getLogger(OUTPUT_HANDLER_LOGGER).addFilter(stopping)
