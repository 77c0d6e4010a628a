"""A server killed mid-run costs the run nothing (issue #16, items 3 and 4), on real vLLM.

Two servers of this run's own (the shared one must survive), ``live.restart_servers``.
After step 1 the frontend of server 1 is killed with SIGKILL, and the step waits (the
``after_step`` hook) until the server has been restarted; meanwhile server 0 generates
what server 1 was running. The run must finish with every sample generated and trained
exactly once under its own id, the loss and the restart recorded, the killed server's
engine processes gone, and server 1 back at the weight version of the push it rejoined
with. (About two minutes: two engine starts, then one restart.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path

import pandas as pd
import pytest

from policies.spec import load_spec
from runtime.launcher import run_live

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
STEPS, BATCH = 6, 16


def _two_free_ports() -> int:
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            base = a.getsockname()[1]
            if base > 65000:
                continue
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", base + 1))
                except OSError:
                    continue
        return base
    raise RuntimeError("no two consecutive free ports")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                kids = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _faults(out: Path) -> list[dict]:
    path = out / "faults.json"
    return json.loads(path.read_text()) if path.exists() else []


@pytest.mark.timeout(900)
def test_a_killed_server_costs_the_run_nothing_and_comes_back(tmp_path):
    spec = load_spec(
        CONFIG,
        ["pipeline.mode=stream-async", f"run.iterations={STEPS}", f"algorithm.batch_size={BATCH}",
         "live.num_servers=2", "live.restart_servers=true", f"live.base_port={_two_free_ports()}"],
    )  # fmt: skip
    killed: dict = {}

    async def after_step(step: int) -> None:
        if step != 1:
            return
        frontend = json.loads((tmp_path / "logs" / "processes.json").read_text())["server-1"]
        killed["engine"] = _descendants(frontend)  # vLLM's engine core and worker
        os.kill(frontend, signal.SIGKILL)
        killed["frontend"] = frontend
        while not any(f["event"] in ("restarted", "restart-failed") for f in _faults(tmp_path)):
            await asyncio.sleep(0.2)  # server 0 takes over meanwhile

    run_live(spec, tmp_path, after_step=after_step)

    assert len(killed["engine"]) >= 2 and not any(_alive(p) for p in killed["engine"])
    faults = _faults(tmp_path)
    events = [(f["event"], f["instance_id"]) for f in faults]
    assert events == [("lost", 1), ("restarted", 1), ("rejoined", 1)], faults
    assert "SIGKILL" in faults[0]["detail"] and str(killed["frontend"]) in faults[0]["detail"]
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    assert sorted(samples["sample_id"]) == list(range(STEPS * BATCH))  # none lost, none twice
    assert samples["train_step"].value_counts().sort_index().tolist() == [BATCH] * STEPS
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["num_servers_lost"] == 1 and metrics["num_samples_trained"] == STEPS * BATCH
    back = samples[(samples["instance_id"] == 1) & (samples["gen_start_s"] > faults[2]["time_s"])]
    assert len(back) > 0 and (back["version_start"] >= faults[2]["version"]).all()
    print(
        f"resubmitted {faults[0]['num_resubmitted']} samples; rejoined at v{faults[2]['version']}"
    )
