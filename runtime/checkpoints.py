"""Where a live run's checkpoints are, and the per-step ones kept beside ``last.pt``.

The trainer writes ``RUN_DIR/checkpoints/last.pt`` after every ``live.checkpoint_every``
steps (atomically: a new file renamed over the old one). So that the policy of an
earlier step can still be exported, the newest ``live.keep_checkpoints`` of them also
stay as ``step-<N>.pt`` (``N``: the global optimizer step, as in ``steps.json``, whose
weights are version ``N + 1``). Each is a hard link to the file just written, so keeping
one costs no write, only the disk of the checkpoint it keeps alive (a copy where the file
system has no hard links); older ones are deleted.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


def last_checkpoint(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / LAST


def step_checkpoint(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINT_DIR / f"step-{step:06d}.pt"


def kept_steps(checkpoint_dir: str | Path) -> list[int]:
    """The global steps with a ``step-<N>.pt`` in ``checkpoint_dir``, ascending."""
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        return []
    found = (_STEP_FILE.match(p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def keep_step(last: Path, step: int, keep: int) -> None:
    """Keep ``last`` (just written for global ``step``) as ``step-<N>.pt`` and delete all
    but the newest ``keep`` of those. ``keep`` 0 keeps none (only ``last.pt``)."""
    folder = last.parent
    if keep > 0:
        target = folder / f"step-{step:06d}.pt"
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(last, tmp)
        except OSError:  # no hard links here: a copy
            shutil.copyfile(last, tmp)
        os.replace(tmp, target)
    steps = kept_steps(folder)
    for old in steps[: max(0, len(steps) - keep)]:
        (folder / f"step-{old:06d}.pt").unlink(missing_ok=True)
