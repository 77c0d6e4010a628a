"""The live actor's trainer job queue and its failure event (:mod:`runtime.actor`)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class JobQueue:
    """The trainer's jobs: FIFO, except that :meth:`put_first` jumps the queue."""

    def __init__(self) -> None:
        self._jobs: collections.deque[Callable[[], Any]] = collections.deque()
        self._ready = asyncio.Event()

    def put(self, job: Callable[[], Any]) -> None:
        self._jobs.append(job)
        self._ready.set()

    def put_first(self, job: Callable[[], Any]) -> None:
        self._jobs.appendleft(job)
        self._ready.set()

    async def get(self) -> Callable[[], Any]:
        while not self._jobs:
            self._ready.clear()
            await self._ready.wait()
        return self._jobs.popleft()


@dataclass(frozen=True, slots=True)
class Failed:
    """A generation or trainer job failed: the run stops with this error."""

    error: Exception
