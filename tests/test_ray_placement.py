"""The spec's cluster section as Ray placement (no Ray needed): bundles per server and
trainer rank, datacenter resources, and the errors that name what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from policies.spec import load_spec
from runtime.ray_placement import (
    Bundle,
    check_plan,
    datacenter_resource,
    label_datacenters,
    plan,
)

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"


def _spec(*sets: str):
    return load_spec(CONFIG, list(sets))


def test_every_instance_and_rank_gets_a_bundle_in_its_datacenter():
    spec = _spec(
        "cluster.generation=[{hardware: cpu, num_gpus: 4, tp: 2, datacenter: dc0},"
        " {hardware: cpu, num_gpus: 1, tp: 1, datacenter: dc1}]",
        "cluster.trainer.num_gpus=2", "cluster.trainer.datacenter=dc1",
    )  # fmt: skip
    layout = plan(spec, gpu=False)
    assert [(s.instance_id, s.pool, s.bundle_index) for s in layout.servers] == [
        (0, 0, 0), (1, 0, 1), (2, 1, 0)
    ]  # fmt: skip
    assert [s.bundle for s in layout.servers] == [
        Bundle(2.0, 0.0, "dc0"), Bundle(2.0, 0.0, "dc0"), Bundle(1.0, 0.0, "dc1")
    ]  # fmt: skip
    assert layout.trainer == (Bundle(1.0, 0.0, "dc1"),) * 2
    assert layout.datacenters == {"dc0", "dc1"}
    on_gpus = plan(spec, gpu=True)
    assert on_gpus.servers[0].bundle == Bundle(1.0, 2.0, "dc0")  # tp GPUs, one CPU
    assert on_gpus.servers[0].bundle.resources(True) == {
        "CPU": 1.0, "GPU": 2.0, datacenter_resource("dc0"): 0.001
    }  # fmt: skip


def test_datacenters_are_labelled_only_where_the_cluster_advertises_them():
    one_dc = plan(_spec(), gpu=False)
    assert label_datacenters(one_dc, {"CPU": 4.0}) is False  # placed anywhere
    assert label_datacenters(one_dc, {"CPU": 4.0, "datacenter_dc0": 10.0}) is True
    two = plan(_spec("cluster.trainer.datacenter=dc1"), gpu=False)
    with pytest.raises(ValueError, match=r"datacenter_dc1.*ray start --resources"):
        label_datacenters(two, {"CPU": 4.0, "datacenter_dc0": 10.0})


def test_servers_asked_for_two_ways_are_an_error_naming_the_keys():
    spec = _spec("cluster.generation.0.num_gpus=2", "live.num_servers=3")
    with pytest.raises(ValueError, match=r"live.num_servers \(3\).*2 generation instance"):
        check_plan(spec, plan(spec, gpu=False))
    attached = _spec("live.server_urls=[http://127.0.0.1:1]")
    with pytest.raises(ValueError, match="server_urls"):
        check_plan(attached, plan(attached, gpu=False))
    check_plan(_spec("cluster.generation.0.num_gpus=2"), plan(_spec(), gpu=False))


def test_ray_without_live_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["run", "live-tiny", "--ray", "--out", str(tmp_path / "x")]) == 2
    assert "--ray places a live run: add --live" in capsys.readouterr().out
    assert not (tmp_path / "x").exists()


def test_the_weight_group_uses_nccl_only_where_every_member_has_gpus_of_its_own(monkeypatch):
    from runtime import live_run
    from runtime.live_run import weight_backend

    cuda = _spec("live.device=cuda")
    # servers started on this machine share its GPU with the trainer: NCCL would refuse
    # the group ("Duplicate GPU detected", seen on an H200: docs/ray.md)
    assert weight_backend(cuda, own_gpus=False) == "gloo"
    assert weight_backend(cuda, own_gpus=True) == "nccl"  # Ray bundles
    attached = _spec("live.device=cuda", "live.server_urls=[http://127.0.0.1:8400]")
    assert weight_backend(attached, own_gpus=True) == "gloo"  # where they run is unknown
    assert weight_backend(_spec("live.device=cpu"), own_gpus=True) == "gloo"
    chosen = _spec("live.device=cuda", "live.weight_backend=nccl")
    assert weight_backend(chosen, own_gpus=False) == "nccl"
    with pytest.raises(ValueError, match="live.weight_backend: nccl needs live.device cuda"):
        _spec("live.device=cpu", "live.weight_backend=nccl")  # refused with the spec
    monkeypatch.setattr(live_run, "live_device", lambda spec: "cpu")  # auto, without CUDA
    with pytest.raises(ValueError, match="live.weight_backend: nccl needs live.device cuda"):
        weight_backend(_spec("live.weight_backend=nccl"), own_gpus=True)
    with pytest.raises(ValueError, match="weight_backend"):
        _spec("live.weight_backend=mpi")
