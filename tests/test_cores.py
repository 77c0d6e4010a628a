"""Which cores the live stages get: half and half, or every core to the trainer where the
stages take turns (colocated modes); a core per server in the wave modes."""

from __future__ import annotations

import os

from sharded_harness import make_model_dir

from experiments.specs import config_path
from policies.spec import load_spec
from runtime import launcher
from runtime.procs import server_core_sets, split_cores


def test_disaggregated_stages_split_the_cores_and_time_shared_ones_give_training_all(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert split_cores(1) == ([0, 1], [2, 3])
    assert split_cores(1, time_shared=True) == ([0, 1], [0, 1, 2, 3])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert split_cores(1, time_shared=True) == ([5], [5])


def test_only_colocated_modes_time_share_the_cores():
    live = config_path("live-tiny")
    assert launcher._time_shared(load_spec(live, ["pipeline.mode=colocated-sync"]))
    for mode in ("disagg-sync", "stream-async", "pipeline"):
        assert not launcher._time_shared(load_spec(live, [f"pipeline.mode={mode}"])), mode


def test_several_servers_get_a_core_each_in_every_mode(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert server_core_sets(2, [0], spread=True) == [[0], [1]]
    assert server_core_sets(3, [0], spread=True) == [[0], [1], [0]]
    assert server_core_sets(2, [0], spread=False) == [[0], [0]]
    assert server_core_sets(1, [0], spread=True) == [[0]]  # one server: the generation cores
    longtail = config_path("live-longtail")
    for mode in ("disagg-sync", "stream-async", "colocated-sync", "pipeline"):
        assert launcher._spread_servers(load_spec(longtail, [f"pipeline.mode={mode}"])), mode
    one = ["pipeline.mode=pipeline", "live.num_servers=1"]
    assert not launcher._spread_servers(load_spec(longtail, one))


def test_the_trainer_takes_one_thread_per_core_it_may_run_on_unless_told(tmp_path):
    import torch

    from runtime.trainer import Trainer, TrainerConfig

    model_dir = make_model_dir(tmp_path)
    before = torch.get_num_threads()
    try:
        Trainer(TrainerConfig(model_dir, batch_size=4, num_threads=0)).initialise()
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
        Trainer(TrainerConfig(model_dir, batch_size=4, num_threads=1)).initialise()
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
