"""Where a live run's checkpoints are, and the per-step ones kept beside the last one.

The trainer writes ``RUN_DIR/checkpoints/last.pt`` after every ``live.checkpoint_every``
steps, skipping one while the last is younger than ``live.checkpoint_min_interval_s``
except at the run's last step (:class:`CheckpointCadence`), atomically (a new file
renamed over the old one); a sharded trainer
(:mod:`runtime.sharded_trainer`) writes the directory ``last.dcp`` instead (built beside
it and published with :func:`publish_dir`). So that the policy of an earlier step can
still be exported, the newest ``live.keep_checkpoints`` of them also stay as
``step-<N>.pt`` (or ``step-<N>.dcp``; ``N``: the global optimizer step, as in
``steps.json``, whose weights are version ``N + 1``). Each is a hard link to the file (or
to every file of the directory) just written, so keeping one costs no write, only the
disk of the checkpoint it keeps alive (a copy where the file system has no hard links);
older ones are deleted.

The single-process trainer snapshots its state and writes it in the background
(:class:`CheckpointWriter`), off the training path; the run's history is not in the
checkpoint but appended to ``history.jsonl`` beside it (:mod:`runtime.history`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
LAST_SHARDED = "last.dcp"
_STEP_FILE = re.compile(r"^step-(\d+)\.(pt|dcp)$")


def last_checkpoint(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / LAST


def step_checkpoint(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:06d}.pt"


def kept_checkpoints(checkpoint_dir: str | Path) -> dict[int, Path]:
    """Global step -> its kept ``step-<N>.pt`` or ``step-<N>.dcp``, ascending."""
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        return {}
    found = ((_STEP_FILE.match(p.name), p) for p in folder.iterdir())
    return dict(sorted((int(m.group(1)), p) for m, p in found if m))


def kept_steps(checkpoint_dir: str | Path) -> list[int]:
    """The global steps with a ``step-<N>.pt`` (or ``.dcp``) in ``checkpoint_dir``."""
    return list(kept_checkpoints(checkpoint_dir))


def find_last(run_dir: str | Path) -> Path:
    """The run's last checkpoint: ``last.dcp`` where a sharded trainer wrote one, else
    ``last.pt`` (which need not exist)."""
    sharded = Path(run_dir) / CHECKPOINT_DIR / LAST_SHARDED
    return sharded if readable(sharded) is not None else last_checkpoint(run_dir)


def _previous(path: Path) -> Path:
    return path.with_name(f".{path.name}.old")


def readable(path: Path) -> Path | None:
    """Where the checkpoint ``path`` can be read: itself, or the previous one that
    :func:`publish_dir` had moved aside when a crash stopped it; None if neither exists."""
    for candidate in (path, _previous(path)):
        if candidate.exists():
            return candidate
    return None


def publish_dir(tmp: Path, path: Path) -> None:
    """Rename the complete directory ``tmp`` to ``path``. The previous ``path`` is moved
    aside first and deleted only once ``tmp`` is in place, so a crash at any point leaves
    a readable checkpoint (:func:`readable`)."""
    old = _previous(path)
    if path.exists():
        if old.exists():  # left by an earlier publish that stopped after its rename
            _remove(old)
        os.replace(path, old)
    os.replace(tmp, path)
    _sync_dir(path.parent)
    if old.exists():
        _remove(old)


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _link(source: Path, target: Path) -> None:
    """Hard-link the file ``source`` (or every file of the directory) as ``target``."""
    if source.is_dir():
        try:
            shutil.copytree(source, target, copy_function=os.link)
        except (OSError, shutil.Error):  # no hard links here: a copy
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
        return
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def keep_step(last: Path, step: int, keep: int) -> None:
    """Keep ``last`` (just written for global ``step``) as ``step-<N>.pt`` (``.dcp`` for a
    directory) and delete all but the newest ``keep`` of those. ``keep`` 0 keeps none."""
    folder = last.parent
    if keep > 0:
        target = folder / f"step-{step:06d}{last.suffix}"
        tmp = target.with_name(f".{target.name}.tmp")
        _remove(tmp)
        _link(last, tmp)
        if tmp.is_dir():
            publish_dir(tmp, target)
        else:
            os.replace(tmp, target)
    kept = kept_checkpoints(folder)
    for old in list(kept)[: max(0, len(kept) - keep)]:
        _remove(kept[old])


class CheckpointWriter:
    """Writes checkpoints in a background thread, one at a time, so the trainer goes on
    training while the file is written and synced. :meth:`submit` first waits for the
    write before it (so at most one snapshot waits in memory) and raises its error, if
    any; :meth:`close` waits for the last one. A write that never finishes (a crash)
    leaves the previous checkpoint in place: files are renamed into place complete."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending: Future | None = None

    def submit(self, write: Callable[[], None]) -> None:
        self.wait()
        self._pending = self._pool.submit(write)

    def wait(self) -> None:
        """Wait for the write in progress; its error (as a RuntimeError naming it)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.result()
        except Exception as err:
            raise RuntimeError(f"writing a checkpoint failed: {type(err).__name__}: {err}") from err

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)


@dataclass(slots=True)
class CheckpointCadence:
    """Which optimizer steps checkpoint: every ``every``-th, skipped while the last one is
    younger than ``min_interval_s`` seconds of the run clock, and the run's last step
    (``num_steps``, global) whatever its number, so that a finished run exports it. The interval bounds
    what a crash loses in time, not in steps: where a step takes a tenth of a second, a
    checkpoint each step costs the trainer a quarter of its CPU."""

    every: int = 1
    min_interval_s: float = 0.0
    num_steps: int | None = None
    last_s: float = 0.0  # when the last checkpoint was taken; at first, the run clock's
    # start (a resumed run's: its checkpoint's time, runtime.actor.Actor.start_clock)

    def due(self, step: int, now_s: float) -> bool:
        """Whether global ``step`` checkpoints; if it does, its time is the last one's."""
        final = self.num_steps is not None and step + 1 >= self.num_steps
        if not final and ((step + 1) % self.every or now_s - self.last_s < self.min_interval_s):
            return False
        self.last_s = now_s
        return True
