"""Children that die with their parent (Linux's ``PR_SET_PDEATHSIG``): no orphans.

Pure Python (no live-runtime imports), so that the simulator's sweep workers use it too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (a crashed launcher).

    ``parent_pid``: the parent this process was started by; if it died before the request
    took effect (the child was re-parented already), this process exits at once. The
    signal follows the parent *thread*: start children from a thread that lives as long."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: nothing to do
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


_fork_parent: list[int] = []  # pid of the process about to fork (one entry, this process)


def _before_fork() -> None:
    _fork_parent[:] = [os.getpid()]


def _after_fork_in_child() -> None:
    die_with_parent(signal.SIGKILL, _fork_parent[0] if _fork_parent else None)


def reap_forks_with_parent() -> None:
    """Every process this one forks from now on (vLLM's engine core, its model worker, and
    theirs in turn) is killed when its parent dies, so that a server killed with SIGKILL
    leaves nothing running. (vLLM starts them with ``fork`` by default; a spawned child
    imports the main module, where :mod:`runtime.server` does the same.)"""
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def start_deaf_to_ctrl_c(process) -> None:  # a multiprocessing process, not yet started
    """Start ``process`` ignoring SIGINT for its whole life (a spawned child inherits the
    ignored disposition through its exec, and Python leaves it so). Ctrl-C reaches the
    whole process group: the command that started the process decides what stops (and
    stops it), instead of each worker raising KeyboardInterrupt wherever it is, a
    traceback each. SIGINT is blocked meanwhile, so a Ctrl-C to the command in that
    instant waits for its own handler instead of being lost."""
    start_deaf_to(process, (signal.SIGINT,))


def start_deaf_to_stop_signals(process) -> None:  # a multiprocessing process, not started
    """As :func:`start_deaf_to_ctrl_c`, and deaf to SIGTERM too: a SIGTERM sent to the whole
    process group (``kill -TERM -PGID``, Slurm, a container's init forwarding it) is the
    command's to act on, as Ctrl-C is. For a child whose death would lose the graceful
    stop's checkpoint (the trainer: runtime.graceful_stop). It still never outlives its
    parent: it dies with it (:func:`die_with_parent`, SIGKILL), and the parent stops it
    by asking, then with SIGKILL."""
    start_deaf_to(process, (signal.SIGINT, signal.SIGTERM))


def deaf_to_stop_signals() -> None:
    """This process ignores SIGINT and SIGTERM from now on, as a process started by
    :func:`start_deaf_to_stop_signals` does: for one that the command does not start itself
    (a trainer rank, a Ray worker, whose own handler turns SIGTERM into an exit). Outside
    the main thread nothing changes (only it may set handlers)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def start_deaf_to(process, signals: tuple[int, ...]) -> None:
    """Start ``process`` ignoring ``signals`` for its whole life (see above); they are
    blocked here meanwhile, so one sent in that instant waits for this process's handler."""
    if threading.current_thread() is not threading.main_thread():
        process.start()  # signal dispositions are the main thread's to change
        return
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals))
    old_handlers = {sig: signal.signal(sig, signal.SIG_IGN) for sig in signals}
    try:
        process.start()
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)


def exit_without_finalizing(code: int) -> None:
    """End the process now, once its work is done and its resources released, without the
    interpreter's finalisation (a server: there, Triton's nanobind bindings, which vLLM
    imports, print hundreds of "leaked type/function" lines on every stop). Logging and
    the standard streams are flushed first; ``atexit`` handlers do not run."""
    import logging
    import sys

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """One process, told apart from a later one that is given the same pid."""

    pid: int
    start_ticks: int  # when it started: /proc/PID/stat's starttime, clock ticks after boot


def identify(pid: int) -> ProcessIdentity | None:
    """The process running as ``pid`` now; None if none does (a zombie does not run), or
    where there is no ``/proc`` to tell (not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else ProcessIdentity(pid, int(fields[19]))


def when_gone(
    process: ProcessIdentity, then: Callable[[], None], poll_s: float = 0.5
) -> threading.Thread:
    """Call ``then`` once ``process`` has ended, from a daemon thread of its own that looks
    every ``poll_s``. A zombie has ended (its parent has not reaped it yet), and so has a
    pid that a newer process was given meanwhile. Where :func:`die_with_parent` is not
    enough: a Ray worker outlives its raylet, and must then stop its server's whole
    process group itself (:mod:`runtime.ray_actors`)."""

    def watch() -> None:
        while identify(process.pid) == process:
            time.sleep(poll_s)
        then()

    thread = threading.Thread(target=watch, name=f"when-gone-{process.pid}", daemon=True)
    thread.start()
    return thread
