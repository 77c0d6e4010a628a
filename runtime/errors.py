"""Errors of a live run that end it with one line naming what died (no live imports here:
the CLI catches these on an install without the live runtime, too)."""

from __future__ import annotations

import signal


class LiveRunError(RuntimeError):
    """A live run stopped: the message is one line naming the process and what to do."""


class ProcessDied(LiveRunError):
    """A process of the run (trainer, generation server) exited while it was needed."""


class TrainerFailed(LiveRunError):
    """A trainer call raised (a checkpoint that could not be written, say): the message is
    its error's first line; the traceback goes to the run's log."""


class StartTimedOut(LiveRunError):
    """A generation server this run started did not answer ``/health`` within
    ``live.startup_timeout_s``: the message names it, its log and that key."""


class StartRefused(LiveRunError):
    """A live run refused before it started (an attached server that would not serve it):
    its run directory got nothing of it."""


class RunInterrupted(KeyboardInterrupt):
    """A live run (or a sweep) stopped by Ctrl-C or SIGTERM: the interrupt, with how to go
    on (``RunDir.how_to_go_on``: the command that resumes after its checkpoint, or, before
    its first, that running it again starts from step 0; a sweep's partial results)."""

    def __init__(self, message: str, how_to_go_on: str) -> None:
        # run.log's last line; Ctrl-C's KeyboardInterrupt says nothing of itself
        super().__init__(f"{message or 'interrupted'}; {how_to_go_on}")
        self.how_to_go_on = how_to_go_on


class NonFiniteGradient(LiveRunError):
    """An optimizer step's gradient was NaN or infinite: the step was not applied."""


def describe_exit(returncode: int | None) -> str:
    """``killed by SIGKILL`` / ``exited with status 1`` / ``still running``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


class MissingExtra(RuntimeError):
    """An optional dependency that the command asked for is not installed."""
