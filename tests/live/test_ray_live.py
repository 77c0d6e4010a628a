"""Live runs on a two-node Ray cluster inside this machine (issue #17), every node on
127.0.0.1, datacenter dc0 on one node and dc1 on the other.

* live-tiny with 2 vLLM servers on dc0 and 2 FSDP2 trainer ranks on dc1, stopped by a
  failure after step 1 and resumed from its sharded checkpoint: together the two parts
  generate and train every sample exactly once, each process lands on its datacenter's
  node, and after every weight update every server serves exactly the trainer's weights;
* elastic generation: a scripted scaling rule adds a server after step 0 and retires it
  two decisions after it joined; no sample is lost or trained twice, the added server
  serves only weights at least as new as the push it joined with, and it is stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest
import scripted_scaling
from proc_view import alive, descendants, off_loopback, wait_until

from policies.spec import load_spec
from runtime.launcher import run_live
from runtime.ray_session import loopback_stays_loopback
from runtime.server_faults import ServerFaults

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
STEPS, BATCH = 4, 16


@pytest.fixture(scope="module")
def cluster():
    """Two Ray nodes on 127.0.0.1 (dc0: the head, dc1), the test process their driver;
    the Ray node id of each datacenter."""
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 2, "node_ip_address": "127.0.0.1"}
    with loopback_stays_loopback(True):
        c = Cluster(
            initialize_head=True,
            head_node_args={**node, "resources": {"datacenter_dc0": 100},
                            "include_dashboard": False},
        )  # fmt: skip
        c.add_node(**node, resources={"datacenter_dc1": 100})
        ray.init(address=c.address, log_to_driver=False)
    try:
        nodes = {
            dc: n["NodeID"]
            for n in ray.nodes()
            for dc in ("dc0", "dc1")
            if f"datacenter_{dc}" in n["Resources"]
        }
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
        yield c.address, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def served_weights(monkeypatch, token):
    """After every weight push, whether each server's checksums equal the trainer's: a
    push whole (``push``: the run's first load) or its second half (``settle``: the
    answers to an in-flight push; the next optimizer step waits for it, so the trainer's
    weights are still the ones pushed)."""
    checks: list[tuple[int, bool]] = []
    push, settle = ServerFaults.push, ServerFaults.settle

    async def check(self: ServerFaults, version: int, members: list[int]) -> None:
        mine = await self.actor.trainer.checksums()
        for i in members:
            url = self.actor.clients[i].base_url + "/weights/checksums"
            served = httpx.get(url, headers={"Authorization": f"Bearer {token}"}).json()
            same = served["version"] == version and set(served["checksums"]) == set(mine)
            for name, (total, squares) in mine.items():
                same = same and served["checksums"][name] == pytest.approx(
                    [total, squares], rel=1e-9, abs=1e-9
                )
            checks.append((version, same))

    async def checked_push(self: ServerFaults, version: int):
        result, members = await push(self, version)
        await check(self, version, members)
        return result, members

    async def checked_settle(self: ServerFaults, version: int, members: list[int]):
        result, members = await settle(self, version, members)
        await check(self, version, members)
        return result, members

    monkeypatch.setattr(ServerFaults, "push", checked_push)
    monkeypatch.setattr(ServerFaults, "settle", checked_settle)
    return checks


class Stop(RuntimeError):
    pass


@pytest.mark.timeout(900)
def test_two_servers_and_two_trainer_ranks_on_two_nodes_resume_exactly(
    cluster, served_weights, token, tmp_path
):
    address, nodes = cluster
    out = tmp_path / "run"
    spec = load_spec(
        CONFIG,
        ["pipeline.mode=stream-async", f"run.iterations={STEPS}", f"algorithm.batch_size={BATCH}",
         "cluster.generation.0.num_gpus=2", "cluster.generation.0.datacenter=dc0",
         "cluster.trainer.num_gpus=2", "cluster.trainer.datacenter=dc1", f"live.token={token}"],
    )  # fmt: skip

    async def stop_after_step_1(step: int) -> None:
        if step == 1:
            raise Stop("stopped after step 1's checkpoint")

    with pytest.raises(Stop):
        run_live(spec, out, after_step=stop_after_step_1, ray_address=address)
    assert (out / "checkpoints" / "last.dcp").is_dir()
    first = json.loads((out / "logs" / "placement.json").read_text())
    # the failure stopped every process of the run: servers (and their engines), ranks
    pids = [where["pid"] for where in first.values()]
    assert wait_until(lambda: not any(alive(pid) for pid in pids), 30), first
    off: list = []

    async def sockets_at_step_2(step: int) -> None:  # every Ray process, server and rank up
        if step == 2:
            pids = [os.getpid(), *descendants(os.getpid())]
            assert len(pids) > 8, "the run's processes are not below the test process"
            off.extend(off_loopback(pids))

    result = run_live(spec, out, after_step=sockets_at_step_2, ray_address=address)  # resumes
    assert off == [], off  # every socket of the run on 127.0.0.1

    placement = json.loads((out / "logs" / "placement.json").read_text())
    for placed in (first, placement):
        assert sorted(placed) == ["server-0", "server-1", "trainer-0", "trainer-1"]
        for name, where in placed.items():
            assert where["node_id"] == nodes["dc0" if name.startswith("server") else "dc1"]
    samples = pd.read_parquet(out / "samples.parquet")
    assert len(samples) == STEPS * BATCH and samples["sample_id"].is_unique
    assert sorted(samples["train_step"].unique()) == list(range(STEPS))
    assert set(samples["instance_id"]) == {0, 1}
    assert result.metrics["num_samples_trained"] == STEPS * BATCH
    steps = json.loads((out / "steps.json").read_text())
    assert [s["step"] for s in steps] == list(range(STEPS))
    # versions 0 (the start), 1 (then the failure), 2 (the resume's start), 3; 2 servers
    assert [v for v, _ in served_weights] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(same for _, same in served_weights), served_weights


def _faults(out: Path) -> list[dict]:
    path = out / "faults.json"
    return json.loads(path.read_text()) if path.exists() else []


@pytest.mark.timeout(900)
def test_an_elastic_run_adds_a_server_then_retires_it_drained(cluster, token, tmp_path):
    address, _ = cluster
    out, steps = tmp_path / "elastic", 6
    spec = load_spec(
        CONFIG,
        ["pipeline.mode=disagg-sync", f"run.iterations={steps}", f"algorithm.batch_size={BATCH}",
         "cluster.generation.0.datacenter=dc0", "cluster.trainer.datacenter=dc1",
         f"policies.allocation={scripted_scaling.register()}", f"live.token={token}"],
    )  # fmt: skip

    async def hold_until_added(step: int) -> None:  # the new engine takes ~40 s to start
        deadline = time.monotonic() + 400
        while step == 1 and not any(f["event"] == "added" for f in _faults(out)):
            assert time.monotonic() < deadline, "the added server never came up"
            await asyncio.sleep(0.5)

    run_live(spec, out, after_step=hold_until_added, ray_address=address)
    faults = _faults(out)
    assert [(f["event"], f["instance_id"]) for f in faults] == [
        ("added", 1), ("rejoined", 1), ("retired", 1)
    ]  # fmt: skip
    added, joined, retired = faults
    samples = pd.read_parquet(out / "samples.parquet")
    assert len(samples) == steps * BATCH and samples["sample_id"].is_unique
    assert samples["train_step"].notna().all()
    served = samples[samples["instance_id"] == 1]
    assert len(served) > 0 and (served["version_start"] >= joined["version"]).all()
    assert (served["gen_end_s"] <= retired["time_s"]).all()
    pid = int(re.search(r"pid (\d+)", added["detail"]).group(1))
    assert not alive(pid), "the retired server's process is still running"
