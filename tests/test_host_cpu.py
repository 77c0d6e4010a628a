"""A live run's CPU by role (runtime.host_cpu): which process counts as what."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from policies.results import CPU_METRICS
from runtime.host_cpu import cpu_use_metrics, run_cpu_by_role

BUSY = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"
# a "server": its leader (the frontend) starts a busy child (the engine) and waits for it
LEADER = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', {busy!r}])\n" + BUSY.format(s=0.1) +
    "child.wait()\n"
)  # fmt: skip


def _start(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_each_process_counts_under_its_role_and_nothing_twice():
    trainer = _start(BUSY.format(s=0.6))
    server = _start(LEADER.format(busy=BUSY.format(s=0.6)))
    stray = _start(BUSY.format(s=0.3))  # below this process, neither trainer nor server
    before = run_cpu_by_role(trainer.pid, [server.pid, 999_999_999])
    during = _until_busy(trainer.pid, server.pid, before)
    for p in (trainer, stray, server):
        p.wait(timeout=30)
    assert set(before) == {"actor", "trainer", "frontend", "engine", "other"}
    assert during["engine"] > before["engine"]  # the leader's child, while it runs
    assert during["trainer"] - before["trainer"] > 0.1
    # gone and reaped, a process takes its CPU with it: roles are read while they run
    gone = run_cpu_by_role(trainer.pid, [server.pid])
    assert set(gone) == {"actor", "other"}


def _until_busy(trainer: int, leader: int, before: dict[str, float]) -> dict[str, float]:
    """The roles' CPU once the trainer has run 0.1 s and the engine has run at all since
    ``before`` (read every 0.1 s, at most 20 s: a loaded host starts the children late)."""
    deadline = time.monotonic() + 20.0
    while True:
        time.sleep(0.1)
        during = run_cpu_by_role(trainer, [leader])
        busy = during.get("trainer", 0.0) - before["trainer"] > 0.1
        if (busy and during.get("engine", 0.0) > before["engine"]) or time.monotonic() > deadline:
            return during


def test_cpu_figures_are_per_sample_and_per_role():
    before = {"actor": 1.0, "trainer": 2.0, "engine": 0.0}
    after = {"actor": 1.5, "trainer": 4.0, "engine": 3.0, "frontend": 9.0}
    out = cpu_use_metrics(before, after, num_samples=100, wall_s=2.5)
    assert out["cpu_ms_per_sample"] == pytest.approx(55.0)  # 5.5 s over 100 samples
    assert out["cpu_ms_per_sample_engine"] == pytest.approx(30.0)
    assert out["cpu_cores_used"] == pytest.approx(2.2)
    assert "cpu_ms_per_sample_frontend" not in out  # not measured at the clock's start
    assert set(out) <= set(CPU_METRICS)
    assert cpu_use_metrics(before, after, num_samples=0, wall_s=2.5) == {}
