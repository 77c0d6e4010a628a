"""A live run's CPU timeline (runtime.cpu_timeline): what it counts, and where it goes
(cpu_timeline.csv, a counter of trace.json, a panel of timeline.png)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from helpers import small_spec
from trace_format import validate_trace

from experiments.plots import timeline
from policies.results import CPU_TIMELINE_FILE, RunResult
from policies.trace import CPU_COUNTER, CPU_PROCESS
from runtime.cpu_timeline import CpuTimeline
from runtime.host_cpu import cpu_seconds
from sim.simulator import Simulation

# waits for a line on stdin, burns `s` seconds of CPU, says so, and waits for the next line
WORKER = (
    "import sys, time\n"
    "for line in sys.stdin:\n"
    "    end = time.process_time() + float(line)\n"
    "    while time.process_time() < end: pass\n"
    "    print('done', flush=True)\n"
)


def _worker() -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _burn(worker: subprocess.Popen, seconds: float) -> None:
    worker.stdin.write(f"{seconds}\n")
    worker.stdin.flush()
    assert worker.stdout.readline().strip() == "done"


def _integral(rows: list[dict], role: str) -> float:
    return sum(r[role] * (r["end_s"] - r["start_s"]) for r in rows)


def test_the_timeline_accounts_for_every_cpu_second_of_each_role():
    engine, trainer = _worker(), _worker()
    try:
        _burn(engine, 0.01)  # both started and waiting: their start-up is behind them
        _burn(trainer, 0.01)
        start = {p.pid: cpu_seconds(p.pid) for p in (engine, trainer)}
        tl = CpuTimeline(
            {"engine": [engine.pid], "trainer": [trainer.pid]}, time.perf_counter, 0.05
        )
        tl.start()
        _burn(engine, 0.3)
        _burn(trainer, 0.1)
        rows = tl.stop()
        used = {p.pid: cpu_seconds(p.pid) - start[p.pid] for p in (engine, trainer)}
    finally:
        for p in (engine, trainer):
            p.kill()
            p.wait()
    # the kernel counts in ticks of 10 ms: the sums agree to a tick or two
    assert _integral(rows, "engine") == pytest.approx(used[engine.pid], abs=0.025)
    assert _integral(rows, "trainer") == pytest.approx(used[trainer.pid], abs=0.025)
    assert used[engine.pid] > 0.25 and used[trainer.pid] > 0.05  # each ran (to a tick or two)
    assert all(r["start_s"] < r["end_s"] for r in rows)
    assert all(a["end_s"] == b["start_s"] for a, b in zip(rows, rows[1:]))  # no gaps
    for r in rows:
        assert r["total"] == pytest.approx(r["engine"] + r["trainer"], abs=1e-3)
        assert r["engine"] >= 0 and r["trainer"] >= 0


def test_a_process_that_ends_adds_nothing_negative():
    worker = _worker()
    _burn(worker, 0.05)
    tl = CpuTimeline({"engine": [worker.pid, 999_999_999]}, time.perf_counter, 0.02)
    tl.start()
    _burn(worker, 0.05)
    worker.kill()
    worker.wait()  # reaped: /proc no longer has it
    time.sleep(0.1)
    rows = tl.stop()
    assert len(rows) >= 3 and all(r["engine"] >= 0 for r in rows)
    assert rows[-1]["engine"] == 0


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval"):
        CpuTimeline({"actor": [1]}, time.perf_counter, 0.0)


def test_a_negative_cpu_sample_interval_is_refused_by_name():
    with pytest.raises(ValueError, match="cpu_sample_s"):
        small_spec(live__cpu_sample_s=-1.0)


def _with_cpu(result: RunResult) -> RunResult:
    end = result.metrics["makespan_s"]
    result.cpu_timeline = [
        {"start_s": 0.0, "end_s": end / 2, "actor": 0.25, "engine": 1.0, "total": 1.25},
        {"start_s": end / 2, "end_s": end, "actor": 0.5, "engine": 0.0, "total": 0.5},
    ]
    return result


def test_the_timeline_is_saved_loaded_traced_and_plotted(tmp_path):
    result = _with_cpu(Simulation(small_spec(run__iterations=2)).run())
    result.save(tmp_path)
    loaded = RunResult.load(tmp_path)
    assert len(loaded.cpu_timeline) == 2
    for got, want in zip(loaded.cpu_timeline, result.cpu_timeline):
        assert got == pytest.approx(want)
    doc = json.loads((tmp_path / "trace.json").read_text())
    validate_trace(doc)
    [pid] = [e["pid"] for e in doc["traceEvents"] if e["args"].get("name") == CPU_PROCESS]
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {pid} and {e["name"] for e in counters} == {CPU_COUNTER}
    assert [e["args"]["engine"] for e in counters] == [1.0, 0.0, 0]  # the last end: all 0
    assert counters[1]["ts"] == round(result.cpu_timeline[1]["start_s"] * 1e6)
    png = timeline(loaded, tmp_path / "timeline.png")
    assert png.stat().st_size > 0


def test_a_run_without_a_timeline_writes_no_file_and_no_counter(tmp_path):
    Simulation(small_spec(run__iterations=2)).run().save(tmp_path)
    assert not (tmp_path / CPU_TIMELINE_FILE).exists()
    doc = json.loads((tmp_path / "trace.json").read_text())
    assert not [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert RunResult.load(tmp_path).cpu_timeline == []
