"""Sweep points as Ray tasks: ``tandem sweep ... --ray [ADDRESS]``.

Each point is one Ray task (one CPU, never retried) that calls
:func:`experiments.sweep_point.run_point`, the function the local worker processes call,
with a temporary run directory; it returns the point's row and run files, and the driver
writes them under ``points/NNNN/``. A cluster therefore needs no file system shared with
the driver, only tandem (the same version) installed on its nodes.

The task is a generator: it yields once as it starts, so a point's clock starts when it
runs, not while it waits for a CPU (as a local worker reports ``started``). A point over
``point_timeout_s`` is cancelled with ``ray.cancel(force=True)``, which kills its worker
process. Leaving the sweep any way (the end, an error, Ctrl-C) cancels every task still
out; a Ray instance the sweep started is shut down, and if the driver is killed Ray's
own reaper stops that instance and a cluster ends the driver's job with its tasks.

Without an address the sweep starts Ray on this machine, every server bound to
127.0.0.1, with no dashboard. ``ray`` is imported only here (the ``ray`` extra).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experiments.sweep_point import Row, base_from_yaml, point_dir, run_point, timeout_row
from policies.results import write_atomic
from policies.spec import RunSpec
from runtime.ray_session import require_ray

LOOPBACK = "127.0.0.1"
STARTED = "started"  # what a point's task yields first, as it starts
WAIT_S = 0.2  # how long one collect waits for a task to report


@dataclass(frozen=True, slots=True)
class PointOutcome:
    """What a point's task returns to the driver."""

    row: Row
    files: dict[str, bytes]  # the point's run files by name: metrics.json, run.log, ...


def point_task(base_yaml: str, point: dict[str, Any]) -> Iterator[str | PointOutcome]:
    """One sweep point as a Ray task: :data:`STARTED`, then its :class:`PointOutcome`."""
    yield STARTED
    with tempfile.TemporaryDirectory(prefix="tandem-point-") as tmp:
        row = run_point(base_from_yaml(base_yaml), point, Path(tmp))
        files = {p.name: p.read_bytes() for p in sorted(Path(tmp).iterdir()) if p.is_file()}
    yield PointOutcome(row, files)


@dataclass(slots=True)
class _Running:
    index: int
    started_s: float | None = None  # time.monotonic() when the task started; None: queued


class RayPool:
    """Sweep points as Ray tasks, at most ``max_in_flight`` at once (None: every point,
    the cluster's CPUs decide how many run)."""

    def __init__(
        self, base: RunSpec, out: Path, max_in_flight: int | None, timeout_s: float | None
    ) -> None:
        self._ray = require_ray()
        self._task = self._ray.remote(num_cpus=1, max_retries=0)(point_task)
        self._base_yaml = base.to_yaml()
        self.out, self.max_in_flight, self.timeout_s = out, max_in_flight, timeout_s
        self._busy: dict[Any, _Running] = {}  # the task's ObjectRefGenerator -> its point

    def has_room(self) -> bool:
        return self.max_in_flight is None or len(self._busy) < self.max_in_flight

    def num_busy(self) -> int:
        return len(self._busy)

    def submit(self, index: int, point: dict[str, Any]) -> None:
        self._busy[self._task.remote(self._base_yaml, point)] = _Running(index)

    def collect(self) -> list[tuple[int, Row]]:
        if not self._busy:
            return []
        ready, _ = self._ray.wait(list(self._busy), num_returns=1, timeout=WAIT_S)
        out = [done for task in ready if (done := self._receive(task)) is not None]
        if self.timeout_s is not None:
            out += self._stop_overdue()
        return out

    def _receive(self, task: Any) -> tuple[int, Row] | None:
        """The next thing ``task`` yielded: its start (None), or its row."""
        running = self._busy.pop(task)
        try:
            value = self._ray.get(next(task))
        except Exception as err:  # noqa: BLE001 - the task failed or its worker died
            return running.index, {"error": self._error_text(err)}
        if value == STARTED:
            running.started_s = time.monotonic()
            self._busy[task] = running
            return None
        for name, data in value.files.items():
            write_atomic(point_dir(self.out, running.index) / name, data)
        return running.index, value.row

    def _error_text(self, err: Exception) -> str:
        if isinstance(err, self._ray.exceptions.WorkerCrashedError):
            return f"worker died: {_first_line(err)}"
        cause = getattr(err, "cause", None)  # a RayTaskError carries the task's exception
        err = cause if isinstance(cause, Exception) else err
        return f"{type(err).__name__}: {_first_line(err)}"

    def _stop_overdue(self) -> list[tuple[int, Row]]:
        now, out = time.monotonic(), []
        for task, running in list(self._busy.items()):
            if running.started_s is not None and now - running.started_s > self.timeout_s:
                self._ray.cancel(task, force=True)
                del self._busy[task]
                out.append((running.index, timeout_row(self.timeout_s)))
        return out

    def close(self) -> None:
        for task in self._busy:
            with contextlib.suppress(Exception):  # Ray may be going down already (Ctrl-C)
                self._ray.cancel(task, force=True)
        self._busy.clear()


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else ""
