"""``cpu_timeline.csv`` kept on disk while a live run's part runs: a part killed with
SIGKILL leaves its CPU rows to the part that resumes it (before, a part wrote them only at
its end, or as a SIGTERM or Ctrl-C stopped it, so a SIGKILLed part lost them all).

The file holds the earlier parts' rows (those a resume keeps:
:meth:`runtime.run_dir.RunDir.earlier_part`), then this part's, each appended and flushed
the moment :class:`runtime.cpu_timeline.CpuTimeline` produces it: a SIGKILL loses at most
the interval being measured. The file is fsynced at least every :data:`FSYNC_EVERY_S`
(a crash of the machine loses at most that much). A row with a column the header lacks
(a role no earlier part had) rewrites the whole file atomically under the wider header.
The format is the one :meth:`policies.results.RunResult.save` writes: pandas' CSV of the
rows, columns in the order they first appear, an empty field where a row has no value.
"""

from __future__ import annotations

import logging
import math
import os
import time
from pathlib import Path
from typing import IO

from policies.results import write_atomic

log = logging.getLogger(__name__)

FSYNC_EVERY_S = 2.0  # at most this long between two fsyncs of the appended rows


def csv_cell(value: float | None) -> str:
    """A value as pandas' ``to_csv`` writes it (a float's shortest repr; empty if none)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


class CpuRowsFile:
    """``path`` (``cpu_timeline.csv``): ``earlier`` rows, then each row :meth:`append`
    gets, on disk as it comes. Nothing is written before the first row."""

    def __init__(self, path: Path, earlier: list[dict[str, float]]) -> None:
        self.path = path
        self._rows = list(earlier)
        self._columns: list[str] = []
        self._file: IO[str] | None = None
        self._synced_s = 0.0  # time.monotonic() of the last fsync
        self._failed = False

    def append(self, row: dict[str, float]) -> None:
        """Add ``row`` to the file (the timeline's thread calls this). A write that fails
        is said once in the run's log; the run goes on, and its end saves every row."""
        if self._failed:
            return
        try:
            self._append(row)
        except OSError as err:
            self._failed = True
            log.warning("%s is no longer written as the run goes (%s): a part killed "
                        "before its end would lose its CPU rows", self.path, err)  # fmt: skip

    def _append(self, row: dict[str, float]) -> None:
        self._rows.append(row)
        if self._file is None or not set(row) <= set(self._columns):
            self._rewrite()
            return
        self._file.write(",".join(csv_cell(row.get(c)) for c in self._columns) + "\n")
        self._file.flush()  # in the kernel's hands: a SIGKILL of this process loses nothing
        if time.monotonic() - self._synced_s >= FSYNC_EVERY_S:
            self._sync()

    def _rewrite(self) -> None:
        """Every row under a header of every column, atomically; appends go on from it."""
        import pandas as pd

        self.close()
        frame = pd.DataFrame(self._rows)
        self._columns = [str(c) for c in frame.columns]
        write_atomic(self.path, frame.to_csv(index=False).encode())
        self._file = self.path.open("a")
        self._synced_s = time.monotonic()

    def _sync(self) -> None:
        assert self._file is not None
        os.fsync(self._file.fileno())
        self._synced_s = time.monotonic()

    def close(self) -> None:
        """Flush, fsync and close the file (the rows stay; the run's save rewrites them)."""
        if self._file is None:
            return
        try:
            self._file.flush()
            self._sync()
        except OSError as err:
            log.warning("%s: the last CPU rows may not be on disk (%s)", self.path, err)
        finally:
            self._file.close()
            self._file = None
