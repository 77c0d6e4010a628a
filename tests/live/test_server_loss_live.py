"""A server killed mid-run costs the run nothing (issue #16, items 3 and 4), on real vLLM.

The run attaches to two servers: the session's shared one (server 0) and one this test
starts (server 1). After step 1 the frontend of server 1 is killed with SIGKILL; server 0
generates what server 1 was running. The run must finish with every sample generated and
trained exactly once under its own id and the loss recorded (naming the process), and
the killed server's engine core and worker must be gone although nothing but their
parent-death signal kills them (an attached server's process group is not the run's).
(One extra engine start, ~40 s. ``live.restart_servers`` is checked without servers in
tests/test_server_faults.py; docs/reliability.md has a live run of it.)
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
from proc_view import alive, descendants

from policies.spec import load_spec
from runtime.launcher import run_live
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
STEPS, BATCH = 6, 16


def _faults(out: Path) -> list[dict]:
    path = out / "faults.json"
    return json.loads(path.read_text()) if path.exists() else []


@pytest.fixture
def second_server(model_dir, token, tmp_path):
    gen_cores, _ = split_cores(1)
    proc = start_server(
        1, model_dir, "127.0.0.1", free_port(), token, gen_cores, 1.0, 512, 64, tmp_path / "s1"
    )
    try:
        wait_healthy(proc, timeout_s=float(os.environ.get("TANDEM_SERVER_TIMEOUT_S", "400")))
        yield proc
    finally:
        stop_server(proc)


@pytest.mark.timeout(600)
def test_a_killed_server_costs_the_run_nothing(server, token, second_server, tmp_path):
    out = tmp_path / "run"
    spec = load_spec(
        CONFIG,
        ["pipeline.mode=stream-async", f"run.iterations={STEPS}", f"algorithm.batch_size={BATCH}",
         f"live.server_urls=[{server},{second_server.base_url}]", f"live.token={token}"],
    )  # fmt: skip
    frontend = second_server.proc.pid
    engine = descendants(frontend)  # vLLM's engine core and worker

    async def after_step(step: int) -> None:
        if step == 1:
            os.kill(frontend, signal.SIGKILL)

    run_live(spec, out, after_step=after_step)

    assert len(engine) >= 2
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(p) for p in engine):
        time.sleep(0.1)
    assert not any(alive(p) for p in engine)  # before: they ran on for minutes
    faults = _faults(out)
    assert [(f["event"], f["instance_id"]) for f in faults] == [("lost", 1)], faults
    assert second_server.base_url in faults[0]["detail"]
    samples = pd.read_parquet(out / "samples.parquet")
    assert sorted(samples["sample_id"]) == list(range(STEPS * BATCH))  # none lost, none twice
    assert samples["train_step"].value_counts().sort_index().tolist() == [BATCH] * STEPS
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_servers_lost"] == 1 and metrics["num_samples_trained"] == STEPS * BATCH
    late = samples[samples["gen_start_s"] > faults[0]["time_s"]]
    assert len(late) > 0 and set(late["instance_id"]) == {0}  # server 0 took over
    print(f"resubmitted {faults[0]['num_resubmitted']} samples to server 0")
