"""The servers' engines yield to the trainer on a shared core (``live.engine_nice``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policies.spec import load_spec
from runtime.engine_proc import renice_engine
from runtime.launcher import engine_nice

# an "engine": a process with a second thread, both sleeping until killed
ENGINE = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)\n"


def _thread_nices(pid: int) -> list[int]:
    """The niceness of each thread of ``pid`` (/proc/PID/task/TID/stat, field 19)."""
    stats = [t / "stat" for t in Path(f"/proc/{pid}/task").glob("*")]
    return [int(s.read_text().rsplit(")", 1)[1].split()[16]) for s in stats]


def _started(code: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", code])
    deadline = time.monotonic() + 20
    while len(_thread_nices(child.pid)) < 2:  # both threads are up
        assert time.monotonic() < deadline, "the child's second thread never started"
        time.sleep(0.02)
    return child


def test_every_thread_below_this_process_gets_the_niceness_and_this_process_keeps_its_own():
    own = os.getpriority(os.PRIO_PROCESS, 0)
    child = _started(ENGINE)
    try:
        assert set(_thread_nices(child.pid)) == {own}
        assert renice_engine(0) == 0  # 0 (the default) changes nothing
        assert set(_thread_nices(child.pid)) == {own}
        assert renice_engine(own + 7) >= 2
        assert set(_thread_nices(child.pid)) == {own + 7}
        assert os.getpriority(os.PRIO_PROCESS, 0) == own
    finally:
        child.kill()
        child.wait(timeout=10)


def test_unset_the_engines_yield_where_each_server_has_a_core_of_its_own():
    longtail = "experiments/configs/live-longtail.yaml"
    cases = [("stream-async", 2, 8), ("disagg-sync", 2, 8), ("pipeline", 2, 8)]
    cases += [("stream-async", 1, 8), ("pipeline", 1, 0)]  # one pipeline server: not niced
    for mode, servers, nice in cases:
        spec = load_spec(
            longtail, [f"pipeline.mode={mode}", f"live.num_servers={servers}", "live.device=cpu"]
        )
        assert spec.live.engine_nice is None
        assert engine_nice(spec) == nice, (mode, servers)
    assert engine_nice(load_spec(longtail, ["live.engine_nice=3"])) == 3
    assert engine_nice(load_spec(longtail, ["live.engine_nice=0"])) == 0
    with pytest.raises(ValueError, match="engine_nice"):
        load_spec(None, ["live.engine_nice=-1"])
