"""``run.log``: the log of one run, written into its run directory while it runs.

Every module logs through the standard library (``logging.getLogger(__name__)``); the
CLI sets the console's level (``--log-level``). :func:`run_log` adds a file handler for
the duration of a run: INFO and above from tandem's own packages, WARNING and above from
everything else (vLLM, httpx), so the file stays readable.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("policies", "sim", "runtime", "ranker", "experiments")
RUN_LOG = "run.log"
LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def is_tandem(record: logging.LogRecord) -> bool:
    """Whether a record comes from one of tandem's packages."""
    return record.name.split(".", 1)[0] in PACKAGES


# ``log.info(..., extra=NOTICE)``: an INFO record the console shows wherever it shows
# warnings (a status the user should see once, e.g. that a live run resumed)
NOTICE = {"notice": True}


class ConsoleLevel(logging.Filter):
    """The console's records: those at ``level`` and above, and the notices
    (:data:`NOTICE`) wherever warnings pass."""

    def __init__(self, level: int) -> None:
        super().__init__()
        self.level = level

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "notice", False):
            return max(record.levelno, logging.WARNING) >= self.level
        return record.levelno >= self.level


class _RunLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or is_tandem(record)


def _attached(path: Path) -> bool:
    return any(
        isinstance(h, logging.FileHandler) and Path(h.baseFilename) == path
        for h in logging.getLogger().handlers
    )


@contextlib.contextmanager
def run_log(out_dir: str | Path, level: int = logging.INFO) -> Iterator[Path]:
    """Append the run's log records to ``out_dir/run.log`` while the block runs.

    The root logger's level is lowered to ``level`` for the block if it was higher (and
    restored after), so the file gets INFO records even when nothing configured logging
    (warnings then still reach stderr, as they did). Nested calls for the same directory
    write each record once."""
    path = (Path(out_dir) / RUN_LOG).resolve()
    if _attached(path):
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.addFilter(_RunLogFilter())
    root = logging.getLogger()
    old_level = root.level
    # with no handler configured, warnings went to stderr (logging.lastResort): keep that
    added = [handler] if root.handlers else [handler, logging.lastResort]
    if old_level > level:
        root.setLevel(level)
    for h in added:
        root.addHandler(h)
    try:
        yield path
    except BaseException as err:
        # the file keeps why the run stopped: the console's error line may be long gone
        # (the file only: the console prints that line itself, once)
        why = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        record = logging.getLogger(__name__).makeRecord(
            __name__, logging.ERROR, __file__, 0, "the run stopped: %s", (" ".join(why.split()),),
            None,
        )  # fmt: skip
        handler.handle(record)
        raise
    finally:
        for h in added:
            root.removeHandler(h)
        root.setLevel(old_level)
        handler.close()


class _Held(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def held_warnings() -> Iterator[list[str]]:
    """While the block runs, what is logged through the root logger reaches none of its
    handlers; the warnings' messages are collected into the list yielded. For a check that
    the real work repeats (``sim.cluster.check_sim_run`` before ``tandem run``): the work
    logs them, once."""
    root = logging.getLogger()
    held, saved = _Held(), root.handlers[:]
    root.handlers = [held]
    try:
        yield held.messages
    finally:
        root.handlers = saved


@contextlib.contextmanager
def noted_warnings() -> Iterator[list[str]]:
    """While the block runs, the warnings' messages logged through the root logger are also
    collected into the list yielded (they reach its handlers as before): what a command has
    already said, so that work repeating it need not say it again."""
    root = logging.getLogger()
    noted = _Held()
    root.addHandler(noted)
    try:
        yield noted.messages
    finally:
        root.removeHandler(noted)
