"""A live run's history beside its checkpoints: appended, never saved again.

A checkpoint needs the run's data position (:class:`~runtime.recorder.DataPosition`): the
samples trained so far, every span and step. Saved whole inside each checkpoint, that
history was written again at every step, so a checkpoint cost grew with the run. Now each
checkpoint appends only what is new since the previous one — one JSON line of
``checkpoints/history.jsonl`` — and the checkpoint itself holds a slim position (the next
step and the clock) marked ``journal``.

Order and crashes: the line is written and synced *before* the checkpoint that refers to
it. A crash between the two leaves a line past the last checkpoint; a crash inside the
write leaves a torn last line. :meth:`HistoryJournal.restore` reads the lines up to the
checkpoint's step, drops the rest (truncating the file there) and rebuilds the full
position. A checkpoint written before the journal (its position whole) is read as before.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from runtime.recorder import DataPosition

JOURNAL = "history.jsonl"
_NEXT_STEP = re.compile(rb'\{"next_step":(\d+)')  # how each line begins (DataPosition.to_dict)


def journal_path(checkpoint: str | Path) -> Path:
    """The journal of the checkpoints beside ``checkpoint`` (``last.pt`` or ``last.dcp``)."""
    return Path(checkpoint).parent / JOURNAL


def journal_steps(path: str | Path) -> int | None:
    """The steps the journal's last complete line covers (its ``next_step``), without
    parsing the lines' samples; None without a journal or a complete line."""
    if not Path(path).exists():
        return None
    last = None
    with open(path, "rb") as f:
        for raw in f:
            if raw.endswith(b"\n") and (found := _NEXT_STEP.match(raw)) is not None:
                last = int(found.group(1))
    return last


def journal_samples(path: str | Path) -> int:
    """The trained samples the journal's complete lines hold (0 without a journal); a
    line past the last checkpoint counts, as in :func:`journal_steps`."""
    if not Path(path).exists():
        return 0
    num_samples = 0
    with open(path, "rb") as f:
        for raw in f:
            if raw.endswith(b"\n") and _NEXT_STEP.match(raw) is not None:
                num_samples += len(json.loads(raw).get("samples", []))
    return num_samples


class HistoryJournal:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, delta: DataPosition) -> None:
        """Append what is new at a checkpoint (``delta.next_step``), synced to disk."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(delta.to_dict(), separators=(",", ":")) + "\n"
        with open(self.path, "ab") as f:
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())

    def restore(self, slim: DataPosition) -> DataPosition:
        """The full position of the checkpoint whose slim position is ``slim``: every line
        up to its step; the lines after it (or torn) are cut off the file."""
        if not slim.journal:
            return slim  # a checkpoint that holds its whole history
        if not self.path.exists():
            raise FileNotFoundError(
                f"checkpoint after step {slim.next_step - 1} keeps its history in "
                f"{self.path}, which is missing: the run directory is incomplete"
            )
        samples, spans, steps, keep = [], [], [], 0
        with open(self.path, "rb") as f:
            for raw in f:
                try:
                    delta = DataPosition.from_dict(json.loads(raw))
                except (ValueError, KeyError, TypeError):
                    break  # torn by a crash while it was written: nothing after it counts
                if delta.next_step > slim.next_step:
                    break  # written before a checkpoint that never landed
                samples += delta.samples
                spans += delta.spans
                steps += delta.steps
                keep += len(raw)
        if keep < self.path.stat().st_size:
            os.truncate(self.path, keep)
        return DataPosition(slim.next_step, slim.time_s, samples, spans, steps)


def resume_position(checkpoint: str | Path, position: DataPosition | None) -> DataPosition | None:
    """The full position to resume from, given what loading ``checkpoint`` returned: its
    history restored from the journal; None (and a journal left by a run that stopped
    before its first checkpoint removed) where there is no checkpoint."""
    journal = HistoryJournal(journal_path(checkpoint))
    if position is None:
        journal.path.unlink(missing_ok=True)
        return None
    return journal.restore(position)
