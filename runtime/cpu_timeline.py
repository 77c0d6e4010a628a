"""A live run's CPU over its clock, role by role, read in the background: ``cpu_timeline.csv``
(the cores each role used in each interval) and a counter track of ``trace.json``.

The run's totals (``cpu_cores_used``, ``cpu_ms_per_sample_*`` in ``metrics.json``) say
what a sample cost; the timeline says when the host's cores worked and when they idled:
while a batch's longest answers decode on one engine, say, or while the trainer trains
alone after them (docs/live-throughput.md). A reading is a few ``/proc/<pid>/stat`` reads
(``runtime.host_cpu``) for the processes the run had when its clock started; the kernel
counts CPU in ticks of 10 ms, so one interval of 0.1 s resolves about 0.1 of a core.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from runtime.host_cpu import cpu_seconds

OnRow = Callable[[dict[str, float]], None]  # a row as it is measured (runtime.cpu_rows_file)
Reading = tuple[float, dict[str, float]]  # the clock's time, each role's CPU s since the last


class CpuTimeline:
    """Reads each role's CPU seconds every ``interval_s`` of ``clock`` on a daemon thread,
    from :meth:`start` to :meth:`stop`; ``on_row`` gets each row the moment it is read (on
    that thread), e.g. to write it (:class:`runtime.cpu_rows_file.CpuRowsFile`)."""

    def __init__(
        self, pids_by_role: dict[str, list[int]], clock: Callable[[], float], interval_s: float,
        on_row: OnRow | None = None,
    ) -> None:  # fmt: skip
        if interval_s <= 0:
            raise ValueError(f"CPU timeline interval must be > 0 s, not {interval_s}")
        self._roles = {role: list(pids) for role, pids in pids_by_role.items()}
        self._clock, self._interval_s, self._on_row = clock, interval_s, on_row
        self._last: dict[int, float] = {}  # each process's CPU seconds at the last reading
        self._readings: list[Reading] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-timeline", daemon=True)

    def _read(self) -> None:
        """CPU each role used since the last reading; a process that has ended adds none."""
        used: dict[str, float] = {}
        for role, pids in self._roles.items():
            total = 0.0
            for pid in pids:
                now = cpu_seconds(pid)
                before = self._last.get(pid)
                if before is not None and now >= before:
                    total += now - before
                if now > 0.0 or before is None:
                    self._last[pid] = now
            used[role] = total
        self._readings.append((self._clock(), used))
        if self._on_row is not None and len(self._readings) > 1:
            row = _row(self._readings[-2], self._readings[-1])
            if row is not None:
                self._on_row(row)

    def _loop(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._read()

    def start(self) -> None:
        self._read()
        self._thread.start()

    def stop(self) -> list[dict[str, float]]:
        """Stop reading; one row per interval: ``start_s``, ``end_s``, the cores each role
        used over it and their ``total``."""
        if self._thread.is_alive():
            self._stopped.set()
            self._thread.join()
            self._read()
        return self.rows()

    def rows(self) -> list[dict[str, float]]:
        pairs = zip(self._readings, self._readings[1:])
        return [row for a, b in pairs if (row := _row(a, b)) is not None]


def _row(before: Reading, after: Reading) -> dict[str, float] | None:
    """The interval between two readings: ``start_s``, ``end_s``, the cores each role
    used over it and their ``total``; None for an empty interval."""
    (t0, _), (t1, used) = before, after
    if t1 <= t0:
        return None
    cores = {role: round(s / (t1 - t0), 4) for role, s in used.items()}
    return {"start_s": round(t0, 4), "end_s": round(t1, 4), **cores,
            "total": round(sum(cores.values()), 4)}  # fmt: skip
