"""The points of a reproduction study, simulated in worker processes with a progress bar.

:func:`run_points` simulates each distinct point once (two figures asking for the same
run share it) in a :class:`PointProcesses`, a :class:`~experiments.sweep_point.PointPool`.

The sweep's loop (:func:`experiments.sweep_point.run_jobs`) drives them, so a study stops
as a sweep does: whatever ends the loop (an error, Ctrl-C, SIGTERM) closes the pool,
which kills the points still running and tells idle workers to exit, so the command
exits at once and leaves no process behind. Workers are spawned (no fork of a process
holding threads, such as the progress bar's), die with the command
(``PR_SET_PDEATHSIG``) and ignore SIGINT: a Ctrl-C reaches the whole process group, and
the command, not each worker, decides what stops.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from experiments.reproduce.points import Point, PointResult, run_one
from experiments.sweep_point import run_jobs
from policies.spec import RunSpec
from runtime.errors import describe_exit
from runtime.lifetime import die_with_parent, start_deaf_to_ctrl_c


def _worker(conn: Connection, parent_pid: int) -> None:
    """Simulate the points this worker is sent, one at a time, until sent ``None``."""
    die_with_parent(signal.SIGKILL, parent_pid)
    while (job := conn.recv()) is not None:
        index, point = job
        conn.send((index, run_one(point)))


class PointProcesses:
    """``size`` worker processes, started as points are submitted; :meth:`close` stops them."""

    def __init__(self, size: int) -> None:
        self.size = max(1, size)
        self._ctx = mp.get_context("spawn")
        self._busy: dict[Connection, tuple[BaseProcess, Point, int]] = {}
        self._idle: list[tuple[BaseProcess, Connection]] = []

    def has_room(self) -> bool:
        return len(self._busy) < self.size

    def num_busy(self) -> int:
        return len(self._busy)

    def submit(self, index: int, point: Point) -> None:
        process, conn = self._idle.pop() if self._idle else self._start()
        conn.send((index, point))
        self._busy[conn] = (process, point, index)

    def _start(self) -> tuple[BaseProcess, Connection]:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker, args=(child, os.getpid()), daemon=True)
        start_deaf_to_ctrl_c(process)  # from the main thread: the parent-death signal too
        child.close()
        return process, parent

    def collect(self) -> list[tuple[int, PointResult]]:
        """The points finished since the last call; waits up to 0.2 s for one."""
        out = []
        for conn in wait(list(self._busy), timeout=0.2):
            process, point, index = self._busy.pop(conn)
            try:
                out.append(conn.recv())
            except (EOFError, OSError):  # the worker died (killed, out of memory...)
                process.join(timeout=5)
                died = f"worker died: {describe_exit(process.exitcode)}"
                out.append((index, PointResult(point, {}, 0, 0, error=died)))
                continue
            self._idle.append((process, conn))
        return out

    def close(self) -> None:
        """Kill the points still running; idle workers exit. The pool is not used again."""
        for _, conn in self._idle:
            with contextlib.suppress(OSError):  # a worker that died idle
                conn.send(None)
        for process, _, _ in self._busy.values():
            process.kill()
        for process, _ in self._idle:
            process.join(timeout=5)
        for process, _, _ in self._busy.values():
            process.join()
        self._idle.clear()
        self._busy.clear()


def _work_hint(spec: RunSpec) -> float:
    """A rough size of a run (samples × max tokens), to start the longest runs first."""
    w = spec.workload
    return (
        spec.run.iterations
        * spec.algorithm.batch_size
        * (w.final_max_output_tokens or w.max_output_tokens)
    )


def run_points(
    points: Sequence[Point], workers: int, label: str, console: Console | None = None
) -> dict[Point, PointResult]:
    """Simulate every distinct point in ``workers`` processes, with a progress bar."""
    specs = {p: p.spec() for p in dict.fromkeys(points)}  # bad overrides fail before any run
    unique = sorted(specs, key=lambda p: -_work_hint(specs[p]))  # longest first packs better
    results: dict[Point, PointResult] = {}
    columns = [*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task(label, total=len(unique))

        def on_result(index: int, result: PointResult) -> None:
            results[unique[index]] = result
            bar.advance(task)

        run_jobs(PointProcesses(workers), list(enumerate(unique)), on_result)  # closes the pool
    failed = [r for r in results.values() if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} point(s) failed; first: {failed[0].error}")
    return results
