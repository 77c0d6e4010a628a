"""``tandem sweep --ray`` (issue #17, item 5): the points as Ray tasks on a local Ray bound to
127.0.0.1 give the local sweep's results exactly, record failed and overdue points as the
local workers do, resume, and leave nothing running when the driver is stopped or killed.

One Ray instance serves the module (``ray_node``; a start costs seconds); the sweeps
under test find it initialised and use it. The tests that stop a driver run the CLI in a
process of its own, which starts and shuts down a Ray of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers import SMALL_YAML, TANDEM
from proc_view import alive, cmdline, descendants, off_loopback, tcp_sockets, wait_until

from experiments import cli
from experiments.cli import main
from experiments.sweep import parse_grid, run_sweep
from experiments.sweep_point import run_point
from policies.results import WALL_METRICS
from policies.spec import load_spec
from runtime.errors import MissingExtra

pytestmark = pytest.mark.timeout(300)  # a sweep that never ends fails instead of hanging CI

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
LONG = 100_000  # iterations of the tiny spec: minutes, far over any timeout here
TASK_TITLE = "ray::point_task"  # a Ray worker's command line while it runs a point
# Ray's per-node agents: they run no task, and when the node dies under them (its driver
# killed) they exit on their own, after a last report to the dead GCS times out (~60 s)
AGENTS = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


@pytest.fixture(scope="module")
def spec_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spec") / "tiny.yaml"
    path.write_text(SMALL_YAML)
    return path


@pytest.fixture(scope="module")
def ray_node():
    """A Ray instance for the module, started as ``tandem sweep --ray`` starts one."""
    import ray

    from runtime.ray_session import start_local_ray

    start_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    monkeypatch.setattr(cli.console, "width", 400)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _sweep(spec: Path, out: Path, *grid_and_flags: str) -> int:
    return main(["sweep", str(spec), *grid_and_flags, "--out", str(out)])


def _row(out: Path, index: int) -> dict:
    return json.loads((out / "points" / f"{index:04d}" / "row.json").read_text())


# --- processes and sockets, from /proc --------------------------------------------------


def _is_ray(command: str) -> bool:
    """Ray's: gcs_server, raylet, its Python services, the agents and workers (``ray::``)."""
    return command.startswith("ray::") or f"{os.sep}ray{os.sep}" in command


def _point_tasks(pid: int) -> list[int]:
    """Processes below ``pid`` running a sweep point (a Ray worker inside point_task)."""
    return [p for p in descendants(pid) if cmdline(p).startswith(TASK_TITLE)]


# --- tests that run the CLI in a process of its own (its own Ray) -----------------------


@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGTERM, True),
     (signal.SIGKILL, False)],
    ids=["ctrl-c", "terminated", "group-terminated", "killed"],
)  # fmt: skip
def test_a_stopped_or_killed_ray_sweep_leaves_no_task_and_no_ray_running(
    spec_path, tmp_path, sig, to_group
):
    """``group-terminated``: SIGTERM to the command's whole process group, as ``timeout``,
    Slurm or systemd send it, reaches the driver alone, not its Ray (which it killed under
    the driver, whose stop then hung 60 s and exited 1: ``Failed to connect to GCS``)."""
    cmd = [*TANDEM, "sweep", str(spec_path), "--grid",
           f"run.iterations={LONG},{LONG + 1}", "--ray", "--workers", "2",
           "--out", str(tmp_path / "sweep")]  # fmt: skip
    err_path = tmp_path / "stderr.txt"
    with err_path.open("w") as err:
        proc = subprocess.Popen(
            cmd, env=ENV, cwd=REPO, stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    started: list[int] = []
    try:
        assert wait_until(lambda: len(_point_tasks(proc.pid)) == 2, 120), "no point started"
        started = [p for p in descendants(proc.pid) if alive(p)]  # Ray's servers too
        (os.killpg if to_group else os.kill)(proc.pid, sig)  # the session's leader: its pgid
        code = proc.wait(timeout=50)
        # SIGTERM exits as the shell's 128 + 15, not ray.init's handler's sys.exit(15)
        assert code == {signal.SIGINT: 130, signal.SIGTERM: 143}.get(sig, -signal.SIGKILL)
        # Ctrl-C, SIGTERM: the sweep cancels its tasks and shuts its Ray down; killed:
        # Ray's reaper stops the node, and its workers exit with it
        may_linger = AGENTS if sig == signal.SIGKILL else ()
        must_go = [p for p in started if not cmdline(p).startswith(may_linger)]
        assert len(must_go) >= 4  # the point tasks, gcs_server, raylet, ...
        # Ray's notice that it enabled token authentication, printed at every start
        assert "Token authentication" not in err_path.read_text()
        if sig != signal.SIGKILL:  # the local sweep's writer: partial tables, no point run
            status = json.loads((tmp_path / "sweep" / "status.json").read_text())
            assert status == {"status": "partial", "num_points_run": 0, "num_points": 2}
            assert pd.read_csv(tmp_path / "sweep" / "results.csv").empty
        assert wait_until(lambda: not any(alive(p) for p in must_go), 30), [
            cmdline(p)[:80] for p in must_go if alive(p)
        ]
    finally:
        for p in [proc.pid, *started]:  # whatever outlived the sweep
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        proc.wait()


def test_without_ray_installed_the_sweep_stops_at_once_naming_the_extra(
    spec_path, tmp_path, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if not installed
    out = tmp_path / "sweep"
    assert _sweep(spec_path, out, "--grid", "run.seed=1,2", "--ray") == 2
    printed = _flat(capsys.readouterr().out)
    assert "--ray needs Ray, which is not installed" in printed
    assert "pip install 'tandem-rl[ray]'" in printed
    assert not out.exists()  # nothing ran
    base = load_spec(spec_path, [])
    with pytest.raises(MissingExtra, match=r"tandem-rl\[ray\]"):
        run_sweep(base, [parse_grid("run.seed=1,2")], out, quiet=True, ray_address="local")


def test_a_ray_address_where_no_cluster_answers_stops_the_sweep_at_once(
    spec_path, tmp_path, capsys, monkeypatch
):
    """Before: Ray retried the dead address for minutes (inside ``ray.init``), then a
    traceback."""
    import ray

    from runtime.procs import free_port

    tried: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: tried.append(k))
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert _sweep(spec_path, tmp_path / "sweep", "--grid", "run.seed=1,2", "--ray", address) == 2
    assert tried == []  # stopped before Ray's own retries
    printed = _flat(capsys.readouterr().out)
    assert f"--ray {address}: no Ray cluster answers there" in printed
    assert "Connection refused" in printed and "ray start --head" in printed
    assert not (tmp_path / "sweep" / "points").exists()


# --- tests on the module's Ray ----------------------------------------------------------


def test_the_local_ray_binds_every_server_to_127_0_0_1(ray_node):
    assert {n["NodeManagerAddress"] for n in ray_node.nodes()} == {"127.0.0.1"}
    ray_pids = descendants(os.getpid())  # gcs_server, raylet, the agents, the workers
    assert any("gcs_server" in cmdline(p) for p in ray_pids)
    sockets = tcp_sockets([os.getpid(), *ray_pids])
    assert any(state == "0A" for state, _, _ in sockets)  # listening servers were found
    assert off_loopback([os.getpid(), *ray_pids]) == []


def _started_by_ray(command: str) -> bool:
    """A process Ray started: a ``ray::`` worker, or one whose program (a binary or script
    of Ray's package) is among its first words. Not one that only mentions Ray's path
    further on, as a multiprocessing forkserver's ``sys_path`` argument does."""
    return command.startswith("ray::") or any(
        f"{os.sep}ray{os.sep}" in word for word in command.split()[:3]
    )


def test_the_local_rays_processes_are_out_of_reach_of_a_signal_to_the_drivers_group(ray_node):
    ray_pids = [p for p in descendants(os.getpid()) if _started_by_ray(cmdline(p))]
    assert any("gcs_server" in cmdline(p) for p in ray_pids)
    in_my_group = []
    for p in ray_pids:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(p) == os.getpgrp():
                in_my_group.append(cmdline(p)[:60])
    assert in_my_group == []


def test_a_ray_sweep_gives_the_local_sweeps_results_exactly(ray_node, spec_path, tmp_path):
    grid = ["--grid", "pipeline.mode=disagg-sync,stream-sync,stream-async"]
    assert _sweep(spec_path, tmp_path / "local", *grid, "--workers", "2") == 0
    assert _sweep(spec_path, tmp_path / "ray", *grid, "--ray") == 0
    local = pd.read_parquet(tmp_path / "local" / "results.parquet")
    ray = pd.read_parquet(tmp_path / "ray" / "results.parquet")
    assert list(ray.columns) == list(local.columns) and len(ray) == 3
    numeric = [c for c in local.select_dtypes("number").columns if c not in WALL_METRICS]
    assert {"throughput_samples_per_s", "pipeline_bubble_s", "mean_staleness"} <= set(numeric)
    for column in numeric:
        assert ray[column].tolist() == local[column].tolist(), column  # bit for bit
    assert ray["pipeline.mode"].tolist() == local["pipeline.mode"].tolist()
    assert ray["error"].isna().all()
    for i in range(3):  # the driver wrote each point's run files from the task's result
        local_dir, ray_dir = (tmp_path / s / "points" / f"{i:04d}" for s in ("local", "ray"))
        assert sorted(p.name for p in ray_dir.iterdir()) == sorted(
            p.name for p in local_dir.iterdir()
        )
        for name in ("samples.parquet", "events.parquet", "steps.json", "spec.yaml"):
            assert (ray_dir / name).read_bytes() == (local_dir / name).read_bytes(), name


def test_a_point_failing_under_ray_is_recorded_as_a_local_worker_records_it(
    ray_node, spec_path, tmp_path
):
    # ``tandem sweep`` refuses such a point before any runs (tests/test_cli.py); the sweep
    # itself records what fails inside a point, as a local worker does
    out = tmp_path / "sweep"
    axes = [parse_grid("model.name=Qwen2.5-7B,NoSuchModel-1B")]
    result = run_sweep(load_spec(spec_path, []), axes, out, quiet=True, ray_address="local")
    assert result.frame["error"].notna().tolist() == [False, True]
    good, bad = _row(out, 0), _row(out, 1)
    assert good["error"] is None and good["num_samples_trained"] == 16
    local = run_point(load_spec(spec_path, []), {"model.name": "NoSuchModel-1B"}, None)
    assert bad["error"] == local["error"]  # the error a local worker records
    assert bad["error"].startswith("ValueError: model.name: unknown model 'NoSuchModel-1B'")
    frame = pd.read_csv(out / "results.csv")
    assert frame["error"].notna().tolist() == [False, True]


def test_a_point_over_its_time_under_ray_is_cancelled_and_recorded(
    ray_node, spec_path, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "sweep"
    grid = ["--grid", f"run.iterations=2,{LONG}", "--point-timeout", "3"]
    cancelled: list = []  # the task of each ray.cancel, as the sweep calls it
    cancel = ray_node.cancel

    def recording_cancel(task, **kwargs):
        cancelled.append(task)
        return cancel(task, **kwargs)

    monkeypatch.setattr(ray_node, "cancel", recording_cancel)
    assert _sweep(spec_path, out, *grid, "--ray") == 1
    assert "point took over 3 s (stopped)" in _flat(capsys.readouterr().out)
    assert _row(out, 0)["error"] is None
    assert _row(out, 1) == {
        "point": 1, "run.iterations": LONG,
        "error": "TimeoutError: point took over 3 s (stopped)",
    }  # fmt: skip
    # the long point (minutes) never ran to its end: Ray says its one task was cancelled
    # (a task left running would block here until pytest's timeout fails the test) ...
    (task,) = cancelled
    with pytest.raises(ray_node.exceptions.TaskCancelledError):
        ray_node.get(next(task))
    # ... and ray.cancel(force=True) killed the worker running it
    assert wait_until(lambda: _point_tasks(os.getpid()) == [], 60)


def test_a_second_ray_sweep_into_the_same_out_skips_the_points_done(
    ray_node, spec_path, tmp_path, capsys
):
    out = tmp_path / "sweep"
    grid = ["--grid", "run.seed=3,4", "--ray"]
    assert _sweep(spec_path, out, *grid) == 0
    done = [out / "points" / "0000" / name for name in ("row.json", "metrics.json")]
    stamps = [(p.stat().st_mtime_ns, p.read_bytes()) for p in done]
    first = _row(out, 1)
    (out / "points" / "0001" / "row.json").unlink()  # as if the sweep had died before it
    capsys.readouterr()
    assert _sweep(spec_path, out, *grid) == 0
    assert [(p.stat().st_mtime_ns, p.read_bytes()) for p in done] == stamps  # not run again
    again = _row(out, 1)  # run again, with the same result
    assert {k: v for k, v in again.items() if k not in WALL_METRICS} == {
        k: v for k, v in first.items() if k not in WALL_METRICS
    }
    assert "2 points (1 already done), 0 failed" in _flat(capsys.readouterr().out)
    assert pd.read_parquet(out / "results.parquet")["point"].tolist() == [0, 1]
