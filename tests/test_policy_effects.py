"""The policy-effect experiment's parts (issue #14 item 5) that need no server: the skewed
workload, the dispatch of each case, the simulated makespans and the savings table."""

from __future__ import annotations

import subprocess
import sys
import time

import pandas as pd
import pytest
from helpers import write_cost_model

from experiments.policy_effects import (
    CASES,
    ServerLimits,
    assign,
    savings,
    shared_host_slowdown,
    sim_makespan_s,
    skewed_requests,
    write_report,
)
from policies.calibrated import cost_model_path
from runtime.host_cpu import ServerCpu, server_cpu
from sim.calibrated import CalibratedCostModel


def _cost(tmp_path):
    return CalibratedCostModel.load(cost_model_path(write_cost_model(tmp_path / "cm"), "test"))


def test_the_workload_is_skewed_and_fits_the_servers():
    requests = skewed_requests(0)
    lengths = sorted(r.max_tokens for r in requests)
    assert len(requests) == 96 and lengths[len(lengths) // 2] <= 40 and lengths[-1] >= 160
    assert all(r.prompt_tokens + r.max_tokens < 512 for r in requests)
    assert all(r.predicted_tokens == r.max_tokens for r in requests)  # the oracle


def test_every_case_assigns_every_request_once(tmp_path):
    cost, limits, requests = _cost(tmp_path), ServerLimits(), skewed_requests(1)
    for case in CASES:
        got = assign(case, requests, limits, cost, seed=1)
        assert len(got) == case.num_servers
        assert sorted(r.sample_id for rs in got.values() for r in rs) == list(range(96))


def test_in_the_sim_balancing_beats_random_and_two_servers_beat_one(tmp_path):
    # (skewness-aware on two instances puts the whole long tail on one of them: whether
    # that wins depends on how step time grows with batch size, so no direction here)
    cost, limits, requests = _cost(tmp_path), ServerLimits(), skewed_requests(2)
    span = {
        c.name: sim_makespan_s(c, assign(c, requests, limits, cost, seed=2), limits, cost)
        for c in CASES
    }
    assert span["least-loaded"] < span["random"]
    assert span["least-loaded"] < span["one-server"]
    # the longest request alone bounds any makespan: its steps at batch 1 at least
    longest = max(r.max_tokens for r in requests)
    assert span["least-loaded"] > longest * cost.decode_step_s(None, 1, 0)


def test_savings_and_the_report(tmp_path):
    rows = []
    for seed in (0, 1):
        for name, live, sim in [("random", 10, 11), ("least-loaded", 8, 8.5),
                                ("skewness-aware+lpt", 7, 7.5), ("one-server", 14, 15)]:  # fmt: skip
            rows.append(
                {"seed": seed, "case": name, "live_makespan_s": live, "sim_makespan_s": sim}
            )
    s = savings(pd.DataFrame(rows))
    first = s[(s["seed"] == 0) & (s["saving"] == "least-loaded vs random")].iloc[0]
    assert round(first["live"], 6) == 0.2 and round(first["sim"], 6) == round(1 - 8.5 / 11, 6)
    text = write_report(pd.DataFrame(rows), tmp_path / "out")
    assert "same: True" in text and (tmp_path / "out" / "savings.csv").exists()


def test_engines_slow_down_only_when_their_whole_demand_exceeds_the_cores():
    assert shared_host_slowdown(1, 0.25, 2) == 1.0  # the frontend has the other core
    assert shared_host_slowdown(2, 0.25, 2) == pytest.approx(1.25)  # every core an engine
    assert shared_host_slowdown(2, 0.25, 4) == 1.0
    assert shared_host_slowdown(3, 0.0, 2) == pytest.approx(1.5)


def test_server_cpu_splits_the_leader_from_the_processes_below_it():
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass"
    leader = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"]
    )  # fmt: skip
    try:
        peak = ServerCpu(0.0, 0.0)
        while leader.poll() is None:
            peak = max(peak, server_cpu(leader.pid), key=lambda c: c.engine_s)
            time.sleep(0.02)
    finally:
        leader.wait()
    assert peak.engine_s >= 0.2  # the child's spin counts as engine time
    assert peak.frontend_s < peak.engine_s  # the leader only waited


class _Server:
    base_url = "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("error", "kept"), [(None, False), (KeyboardInterrupt, False), (RuntimeError, True)]
)
def test_the_servers_logs_stay_only_where_the_measuring_failed(error, kept, tmp_path, monkeypatch):
    """Seen: every run, finished or stopped, left a /tmp/policy-effects-* folder behind."""
    import tempfile

    import experiments.policy_effects as effects
    import runtime.model
    import runtime.procs
    import runtime.profile_bursts

    logs, stopped, ticks = tmp_path / "logs", [], []
    monkeypatch.setattr(tempfile, "mkdtemp", lambda prefix: str(logs.mkdir() or logs))
    monkeypatch.setattr(runtime.model, "ensure_tiny_model", lambda seed: tmp_path)
    monkeypatch.setattr(runtime.procs, "start_server", lambda *args: _Server())
    monkeypatch.setattr(runtime.procs, "wait_healthy", lambda server: None)
    monkeypatch.setattr(runtime.procs, "stop_server", stopped.append)

    async def nothing(*args, **kwargs) -> float:
        return 1.0

    monkeypatch.setattr(runtime.profile_bursts, "warm_up", nothing)
    monkeypatch.setattr(effects, "host_overhead", nothing)

    def measured(*args, progress=None):
        if error is not None:
            raise error("stopped")
        return pd.DataFrame({"seed": [0]})

    monkeypatch.setattr(effects, "measure", measured)
    monkeypatch.setattr(effects, "write_report", lambda frame, out: "report")
    cost = write_cost_model(tmp_path / "cm")
    run = lambda: effects.run_policy_effects(cost, tmp_path / "out", [0], 8, ticks.append)  # noqa: E731
    if error is None:
        assert run() == "report"
    else:
        with pytest.raises(error):
            run()
    assert logs.exists() == kept and len(stopped) == 2
    assert ticks == ["servers up", "warm-up"]
