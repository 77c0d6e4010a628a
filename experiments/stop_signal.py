"""SIGTERM unwinds a command as Ctrl-C does, and the command's exit code says which came.

The handler raises ``KeyboardInterrupt``, not ``SystemExit``: Ray's blocking calls
(``ray.wait``, ``ray.get``) run the signal handlers themselves and pass a
``KeyboardInterrupt`` on as one, but turn any ``SystemExit`` into ``SystemExit(1)``.
"""

from __future__ import annotations

import signal
from types import FrameType, TracebackType

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class SigtermUnwinds:
    """While active, SIGTERM raises ``KeyboardInterrupt`` in the main thread and is
    remembered; :meth:`exit_code` is then 128 + 15, as a shell reports it, else 130."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: object = None

    def __enter__(self) -> SigtermUnwinds:
        self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    def exit_code(self) -> int:
        return INTERRUPTED_EXIT if self.signum is None else 128 + self.signum

    def what(self) -> str:
        return "interrupted" if self.signum is None else "terminated"
