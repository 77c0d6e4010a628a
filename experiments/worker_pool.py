"""Local worker processes that run jobs one at a time: the executor of a sweep's points
and of a reproduction study's (a :class:`~experiments.sweep_point.PointPool`).

Workers are spawned (no fork of a process holding threads, such as a progress bar's), die
with the command (``PR_SET_PDEATHSIG``) and ignore SIGINT: a Ctrl-C reaches the whole
process group, and the command, not each worker, decides what stops. :meth:`close` kills
the jobs still running and tells idle workers to exit, so the command exits at once and
leaves no process behind. A job over ``timeout_s``, counted from when its worker starts it
(not from the spawn), is stopped with its worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from runtime.errors import describe_exit
from runtime.lifetime import die_with_parent, start_deaf_to_ctrl_c

# (index, job) -> the job's result, in the worker; picklable (a module-level function or a
# functools.partial of one); it must return failures as results, never raise
Work = Callable[[int, Any], Any]
# (job, why) -> the result of a job whose worker died or that ran over its time
Failed = Callable[[Any, str], Any]


def over_time(timeout_s: float) -> str:
    """Why a job stopped for running over ``timeout_s`` was stopped."""
    return f"TimeoutError: point took over {timeout_s:g} s (stopped)"


def _worker(conn: Connection, work: Work, parent_pid: int) -> None:
    """Run the jobs this worker is sent, one at a time, until sent ``None``."""
    die_with_parent(parent_pid=parent_pid)
    while (message := conn.recv()) is not None:
        index, job = message
        conn.send(("started", None))  # the job's clock starts now
        conn.send(("done", work(index, job)))


@dataclass(slots=True)
class _Busy:
    process: BaseProcess
    index: int
    job: Any
    start: float | None = None  # None until the worker has started the job


class WorkerProcesses:
    """``size`` worker processes, started as jobs are submitted; :meth:`close` stops them."""

    def __init__(
        self, work: Work, size: int, failed: Failed, timeout_s: float | None = None
    ) -> None:
        self.size, self.timeout_s = max(1, size), timeout_s
        self._work, self._failed = work, failed
        self._ctx = mp.get_context("spawn")
        self._busy: dict[Connection, _Busy] = {}
        self._idle: list[tuple[BaseProcess, Connection]] = []

    def has_room(self) -> bool:
        return len(self._busy) < self.size

    def num_busy(self) -> int:
        return len(self._busy)

    def submit(self, index: int, job: Any) -> None:
        process, conn = self._idle.pop() if self._idle else self._start()
        conn.send((index, job))
        self._busy[conn] = _Busy(process, index, job)

    def _start(self) -> tuple[BaseProcess, Connection]:
        parent, child = self._ctx.Pipe()
        args = (child, self._work, os.getpid())
        process = self._ctx.Process(target=_worker, args=args, daemon=True)
        start_deaf_to_ctrl_c(process)  # from the main thread: the parent-death signal too
        child.close()
        return process, parent

    def collect(self) -> list[tuple[int, Any]]:
        """The jobs finished (or stopped) since the last call; waits up to 0.2 s for one."""
        out = []
        for conn in wait(list(self._busy), timeout=0.2):
            busy = self._busy[conn]
            try:
                kind, result = conn.recv()
            except (EOFError, OSError):  # the worker died (killed, out of memory...)
                del self._busy[conn]
                busy.process.join(timeout=5)
                why = f"worker died: {describe_exit(busy.process.exitcode)}"
                out.append((busy.index, self._failed(busy.job, why)))
                continue
            if kind == "started":
                busy.start = time.monotonic()
            else:
                del self._busy[conn]
                out.append((busy.index, result))
                self._idle.append((busy.process, conn))
        if self.timeout_s is not None:
            out += self._stop_overdue(self.timeout_s)
        return out

    def _stop_overdue(self, timeout_s: float) -> list[tuple[int, Any]]:
        now, out = time.monotonic(), []
        for conn, busy in list(self._busy.items()):
            if busy.start is not None and now - busy.start > timeout_s:
                busy.process.kill()
                busy.process.join()
                del self._busy[conn]
                out.append((busy.index, self._failed(busy.job, over_time(timeout_s))))
        return out

    def close(self) -> None:
        """Kill the jobs still running; idle workers exit. The pool is not used again."""
        for _, conn in self._idle:
            with contextlib.suppress(OSError):  # a worker that died idle
                conn.send(None)
        for busy in self._busy.values():
            busy.process.kill()
        for process, _ in self._idle:
            process.join(timeout=5)
        for busy in self._busy.values():
            busy.process.join()
        self._idle.clear()
        self._busy.clear()
