"""Nothing a run starts outlives it (issue #16, item 3), checked with small stand-in processes.

``stop_server`` kills a server's whole process group even when its leader is already
dead; children forked below a process that installed :func:`reap_forks_with_parent`
(the server does, for vLLM's engine core and worker) die with it; the trainer child and
the sweep's workers die when the command that started them is killed; a dead trainer
is named with its exit signal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import TANDEM
from proc_view import alive, descendants

from runtime.errors import ProcessDied, describe_exit
from runtime.lifetime import identify, when_gone
from runtime.procs import ServerProcess, group_alive, stop_server

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _wait_gone(pids: list[int], timeout_s: float = 20.0) -> list[int]:
    """The pids still alive after waiting up to ``timeout_s`` for them to exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def _wait_for_line(proc: subprocess.Popen, timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip():
            return line.strip()
    raise AssertionError("the helper process printed nothing")


def test_exit_descriptions_name_the_signal():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(1) == "exited with status 1"


def test_stop_server_kills_the_whole_group_when_its_leader_is_already_dead(tmp_path):
    cmd = ["sh", "-c", "sleep 300 & sleep 300 & wait"]  # a leader with two children
    proc = subprocess.Popen(cmd, start_new_session=True)
    for _ in range(100):
        if len(descendants(proc.pid)) == 2:
            break
        time.sleep(0.02)
    children = descendants(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)  # the API server dies, its engine processes run on
    proc.wait()
    assert all(alive(c) for c in children)
    stop_server(ServerProcess(0, "http://127.0.0.1:1", proc, tmp_path / "log"), grace_s=5)
    assert _wait_gone(children, 5) == [] and not group_alive(proc.pid)


def test_a_watched_process_killed_but_not_yet_reaped_counts_as_gone():
    """A Ray worker watches its raylet (runtime.ray_actors.exit_with_raylet); a killed
    raylet stayed a zombie, its parent not reaping it, and Ray's worker ran on."""
    proc = subprocess.Popen(["sleep", "300"])
    watched = identify(proc.pid)
    assert watched is not None and watched.pid == proc.pid
    ended = threading.Event()
    when_gone(watched, ended.set, poll_s=0.05)
    assert not ended.wait(0.3)  # running: nothing called
    os.kill(proc.pid, signal.SIGKILL)
    try:
        assert ended.wait(30), "the watch did not see its process end"
        assert Path(f"/proc/{proc.pid}").exists()  # still a zombie: this test reaps it below
    finally:
        proc.wait()


FORKER = """
import multiprocessing as mp, os, sys, time
from runtime.procs import reap_forks_with_parent
reap_forks_with_parent()
def grandchild(): time.sleep(300)
def child():
    p = mp.get_context("fork").Process(target=grandchild); p.start()
    print(os.getpid(), p.pid, flush=True); time.sleep(300)
c = mp.get_context("fork").Process(target=child); c.start(); c.join()
"""


def test_processes_forked_below_a_server_die_when_it_is_killed():
    proc = subprocess.Popen(
        [sys.executable, "-c", FORKER], env=ENV, stdout=subprocess.PIPE, text=True
    )
    kids: list[int] = []
    try:
        kids = list(map(int, _wait_for_line(proc).split()))
        os.kill(proc.pid, signal.SIGKILL)  # like a server frontend killed with SIGKILL
        proc.wait()
        assert _wait_gone(kids) == []
    finally:
        for p in (proc.pid, *kids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


TRAINER = """
import asyncio, threading, time
from runtime.procs import free_port
from runtime.trainer import TrainerConfig
from runtime.trainer_proc import ServerAddr, TrainerProcess
if __name__ == "__main__":
    t = TrainerProcess(TrainerConfig("/nonexistent", batch_size=4))
    t.start()
    # busy: waiting (up to a minute) in the weight group for a server that never joins
    join = t.join_group([ServerAddr("http://127.0.0.1:9", None)], "127.0.0.1", free_port(), "gloo")
    threading.Thread(target=asyncio.run, args=(join,), daemon=True).start()
    time.sleep(3)
    print(t._proc.pid, flush=True)
    time.sleep(300)
"""


def test_the_trainer_dies_with_the_command_that_started_it(tmp_path):
    script = tmp_path / "launcher.py"
    script.write_text(TRAINER)
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=ENV, cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    trainer = int(_wait_for_line(proc))
    try:
        os.kill(proc.pid, signal.SIGKILL)  # `tandem run` killed
        proc.wait()
        assert _wait_gone([trainer]) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGKILL)


def test_a_dead_trainer_is_named_with_its_exit_signal():
    from runtime.trainer import TrainerConfig
    from runtime.trainer_proc import TrainerProcess

    trainer = TrainerProcess(TrainerConfig("/nonexistent", batch_size=4))
    trainer.start()
    try:
        os.kill(trainer.pid, signal.SIGKILL)
        with pytest.raises(
            ProcessDied,
            match=rf"trainer process \(pid {trainer.pid}\) killed by SIGKILL during step",
        ):
            asyncio.run(trainer.step(0, 0.0))
    finally:
        trainer.stop()


def test_sweep_workers_die_with_the_sweep(tmp_path):
    cmd = [*TANDEM, "sweep", "streamrl-7b", "--grid",
           "run.seed=1,2,3,4", "--set", "run.iterations=100000", "--set",
           "algorithm.batch_size=64", "--workers", "2", "--out", str(tmp_path / "sweep")]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    workers: list[int] = []
    try:
        for _ in range(600):
            workers = [p for p in descendants(proc.pid) if alive(p)]
            if len(workers) >= 2:
                break
            time.sleep(0.1)
        assert len(workers) >= 2, "the sweep started no workers"
        time.sleep(0.5)  # the workers are simulating
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert _wait_gone(workers) == []
    finally:
        for p in workers:  # whatever outlived the sweep (the old behaviour)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("after_s", [1.0, 4.0])  # workers importing; workers simulating
def test_ctrl_c_stops_a_sweep_with_one_line_and_no_worker_left(tmp_path, after_s):
    """Ctrl-C reaches the terminal's whole process group. Before, each worker raised
    KeyboardInterrupt wherever it was (in its imports, or mid-simulation) and printed a
    traceback; now workers ignore SIGINT and the sweep stops them."""
    cmd = [*TANDEM, "sweep", "streamrl-7b", "--grid", "run.seed=1,2,3,4", "--set",
           "run.iterations=100000", "--set", "algorithm.batch_size=64", "--workers", "2",
           "--out", str(tmp_path / "sweep")]  # fmt: skip
    proc = subprocess.Popen(
        cmd, env=ENV, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline:
            workers = [p for p in descendants(proc.pid) if alive(p)]
            time.sleep(0.05)
        time.sleep(after_s)
        os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C
        out, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted" in out
    assert _wait_gone(workers) == []
