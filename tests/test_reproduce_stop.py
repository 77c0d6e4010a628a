"""Ctrl-C (or SIGTERM) stops ``tandem reproduce`` as it stops ``tandem sweep``: exit 130
(143) at once, and no worker process left behind (it used to hang at exit, joining
workers never told to stop, and leave them orphaned)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import TANDEM
from proc_view import alive, descendants

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _workers(pid: int, count: int, timeout_s: float) -> list[int]:
    """The live descendants of ``pid`` once there are ``count`` of them (or the deadline)."""
    deadline = time.monotonic() + timeout_s
    found = [p for p in descendants(pid) if alive(p)]
    while len(found) < count and time.monotonic() < deadline:
        time.sleep(0.1)
        found = [p for p in descendants(pid) if alive(p)]
    return found


Signals = tuple[tuple[bool, signal.Signals], ...]  # (to the whole group?, signal), in order
TIMEOUT_INT: Signals = ((False, signal.SIGINT), (True, signal.SIGINT))  # as timeout(1) sends
CTRL_C: Signals = ((True, signal.SIGINT),)  # a terminal's Ctrl-C reaches the whole group
SIGTERM: Signals = ((False, signal.SIGTERM),)
KILLED_BY_SIGINT = -signal.SIGINT  # a second Ctrl-C during the unwind: a shell shows 130


@pytest.mark.parametrize(
    ("signals", "exit_codes"),
    [(TIMEOUT_INT, {130, KILLED_BY_SIGINT}), (CTRL_C, {130}), (SIGTERM, {143})],
    ids=["timeout -s INT", "ctrl-c", "sigterm"],
)
def test_a_stop_exits_at_once_and_leaves_no_workers(
    tmp_path: Path, signals: Signals, exit_codes: set[int]
) -> None:
    cmd = [*TANDEM, "reproduce", "streamrl", "--quick",
           "--workers", "2", "--out", str(tmp_path / "report")]  # fmt: skip
    proc = subprocess.Popen(cmd, env=ENV, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    workers: list[int] = []
    try:
        workers = _workers(proc.pid, 2, timeout_s=30)
        assert len(workers) >= 2, "reproduce started no workers"
        time.sleep(1.0)  # the workers are simulating
        workers = [p for p in descendants(proc.pid) if alive(p)]
        for to_group, signum in signals:
            (os.killpg if to_group else os.kill)(proc.pid, signum)
            time.sleep(0.2)
        assert proc.wait(timeout=10) in exit_codes  # the old code hung here, or ran on
        deadline = time.monotonic() + 5
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [p for p in workers if alive(p)] == []
    finally:
        for p in [proc.pid, *workers]:  # whatever outlived the command (the old behaviour)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.wait()
