"""A graceful stop: SIGTERM or Ctrl-C checkpoints the last trained step, then unwinds.

SIGTERM is how a scheduler preempts a job, and the command turns it into the unwind
Ctrl-C gets (``experiments/stop_signal.py``). Unwound at once, a live run loses every
step trained since its last checkpoint, which ``live.checkpoint_min_interval_s`` spaces
out. While a live run's actor loop runs (:meth:`StopRequests.listening`), the first
SIGINT or SIGTERM instead asks the actor to stop: it lets the trainer's job in progress
finish, starts no other, checkpoints the last completed optimizer step if the last
checkpoint is older (:mod:`runtime.step_checkpoints`), then raises :class:`RunStopped`,
and the handler that was there before gets the signal (which unwinds the run as before,
and lets the command's handler note which signal came). A second signal unwinds at once,
and so does a stop whose job in progress and checkpoint take longer than
``live.stop_grace_s`` (default 60 s): it says plainly that it did not checkpoint and which
step the run resumes after (:meth:`runtime.step_checkpoints.StepCheckpoints.out_of_grace`).
The grace is one deadline for the whole stop (:class:`StopDeadline`), set when the first
signal comes: the actor's wait takes what is left of it, and so does the teardown's wait
for the trainer to end its call and its checkpoint, so a stop out of grace ends about
``live.stop_grace_s`` after the signal (it took twice that when each waited a whole grace).

The trainer process ignores SIGINT and SIGTERM (``runtime.lifetime``; on Ray each trainer
rank does: ``runtime.ray_actors.TrainerRank``): a signal sent to the whole process group
(``kill -TERM -PGID``, Slurm, a container's init) reaches the command, which stops the
trainer once the stop's checkpoint is written; it still dies with the command
(``PR_SET_PDEATHSIG``). The servers the run starts are process groups of their own,
out of reach of such a signal; one that dies anyway is a lost server, and the stop's
checkpoint, the trainer's alone, is written all the same.

Once the run's results are saved (:meth:`StopRequests.results_saved`), the run has
finished: the first SIGINT or SIGTERM after that no longer turns it into an interrupted
one. It is noted (``run.log`` and the console say it came during the shutdown) and the
shutdown goes on: the launcher stops the trainer and the servers, and the command
(``tandem run``) finishes its tracking, plot and summary, and exits 0, its tracking's end
FINISHED. A second signal unwinds at once, as before.

Only a signal whose handler is Python's own (``default_int_handler``, the command's
``SigtermUnwinds``) is taken: one left at the system's default still ends the process.
Outside the main thread nothing changes (only it may set handlers). SIGKILL stays a loss
of the steps since the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from policies.logs import NOTICE

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class StopDeadline:
    """When a stop must be over: ``grace_s`` (``live.stop_grace_s``) after it began, on
    ``time.monotonic()``'s clock. Made once, as the stop begins; every wait of the stop
    (the actor's, the teardown's) takes :meth:`remaining_s`."""

    grace_s: float
    at_s: float

    @classmethod
    def from_now(cls, grace_s: float) -> StopDeadline:
        return cls(grace_s, time.monotonic() + grace_s)

    def remaining_s(self) -> float:
        return max(0.0, self.at_s - time.monotonic())


@dataclass(frozen=True, slots=True)
class StopRequested:
    """The actor loop's event for a stop request (:meth:`runtime.actor.Actor.request_stop`)."""

    deadline: StopDeadline


OnStop = Callable[[StopDeadline], None]  # the listener of a stop request (the actor's)


class RunStopped(BaseException):
    """The actor stopped on request, its last trained step checkpointed (unless the stop
    ran out of ``live.stop_grace_s``: its message says so). Like
    ``KeyboardInterrupt`` no ``except Exception`` takes it, but asyncio passes it on as a
    task's result (an interrupt leaves the event loop from whichever task it is raised in);
    :class:`StopRequests` turns it into the signal's unwind."""


class StopRequests:
    """While active, SIGINT and SIGTERM call the listener (see the module) instead of
    their handlers; without one, or the second time, the handler that was there before.
    The first one starts the stop's :attr:`deadline`, ``grace_s`` (``live.stop_grace_s``)
    from then."""

    def __init__(self, grace_s: float) -> None:
        self.signum: int | None = None  # the signal that asked for the stop, if one did
        self.grace_s = grace_s
        self.deadline: StopDeadline | None = None  # set by the first stop signal
        self._previous: dict[int, Any] = {}
        self._listener: tuple[asyncio.AbstractEventLoop, OnStop] | None = None
        self._saved = False  # the run's results are saved: a signal only ends its shutdown
        self.late_signum: int | None = None  # the signal that came after they were saved

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if callable(handler := signal.getsignal(sig)):
                    self._previous[sig] = handler
                    signal.signal(sig, self._handle)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._restore()
        if isinstance(err, RunStopped):
            self._deliver()
        if self.late_signum is not None:
            name = signal.Signals(self.late_signum).name
            log.info("%s came after the run had finished and saved its results: it shut "
                     "down as a finished run", name, extra=NOTICE)  # fmt: skip

    def results_saved(self) -> None:
        """From now on the run has finished: a first stop signal is noted
        (:attr:`late_signum`), not raised, and the shutdown goes on; a second one unwinds."""
        self._saved = True

    @contextlib.contextmanager
    def listening(self, on_request: OnStop) -> Iterator[None]:
        """For the block (inside the running event loop), a stop signal calls ``on_request``
        with the stop's deadline in the loop. A request the block did not end on is
        delivered after it."""
        self._listener = (asyncio.get_running_loop(), on_request)
        try:
            yield
        finally:
            self._listener = None
        if self.signum is not None:  # asked, but the block ended first: stop now
            self._restore()
            self._deliver()

    def grace_left_s(self, otherwise_s: float) -> float:
        """What is left of the stop's deadline; ``otherwise_s`` where no stop began."""
        return otherwise_s if self.deadline is None else self.deadline.remaining_s()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._saved and self.late_signum is None:
            self.late_signum = signum
            return
        if self.deadline is None:
            self.deadline = StopDeadline.from_now(self.grace_s)
        if self._listener is None or self.signum is not None:
            self._restore()
            self._previous_handler(signum)(signum, frame)  # unwinds at once, as before
            return
        self.signum = signum
        loop, on_request = self._listener
        loop.call_soon_threadsafe(on_request, self.deadline)

    def _deliver(self) -> None:
        """The stop's signal to the handler before (it raises KeyboardInterrupt)."""
        if self.signum is not None and callable(handler := self._previous_handler(self.signum)):
            handler(self.signum, None)
        raise KeyboardInterrupt(f"stopped by {signal.Signals(self.signum or 2).name}")

    def _previous_handler(self, signum: int) -> Any:
        return self._previous.get(signum, signal.default_int_handler)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            if signal.getsignal(sig) == self._handle:
                signal.signal(sig, handler)
