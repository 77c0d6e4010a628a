"""A generation server stopped on request: its log ends without vLLM's ``EngineDeadError``
traceback (runtime.server_stop), while an engine that dies as it serves still logs one.

Before: 5 of 6 stops of a real ``tandem serve`` ended its log with ``AsyncLLM output_handler
failed.`` and an ``EngineDeadError`` traceback; after: 0 of 11 (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

from vllm.v1.engine.exceptions import EngineDeadError

from runtime.server_stop import (
    OUTPUT_HANDLER_LOGGER,
    StopNotingLoop,
    quiet_engine_dead_at_stop,
)


def _fail(log: logging.Logger, error: Exception) -> None:
    try:
        raise error
    except Exception:
        log.exception("AsyncLLM output_handler failed.")


def test_the_output_handlers_engine_dead_error_is_left_out_only_after_a_stop_signal(caplog):
    log = logging.getLogger(OUTPUT_HANDLER_LOGGER)
    before = list(log.filters)
    handled: list[str] = []

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        quiet_engine_dead_at_stop(loop)
        stopped = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, lambda: (handled.append("TERM"), stopped.set()))
        _fail(log, EngineDeadError())  # the engine died while serving: a crash, logged
        os.kill(os.getpid(), signal.SIGTERM)
        await stopped.wait()
        _fail(log, EngineDeadError())  # at the requested stop: left out
        _fail(log, RuntimeError("other"))  # anything else still logged
        loop.remove_signal_handler(signal.SIGTERM)

    try:
        with (
            caplog.at_level(logging.ERROR, logger=OUTPUT_HANDLER_LOGGER),
            asyncio.Runner(loop_factory=StopNotingLoop) as runner,
        ):
            runner.run(serve())
    finally:
        log.filters[:] = before
    assert handled == ["TERM"]  # vLLM's own handler still runs
    errors = [type(r.exc_info[1]).__name__ for r in caplog.records if r.name == log.name]
    assert errors == ["EngineDeadError", "RuntimeError"]
