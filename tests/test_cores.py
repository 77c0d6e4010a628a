"""Which cores the live stages get, and how many threads the trainer takes there."""

from __future__ import annotations

import os

from sharded_harness import make_model_dir

from runtime.procs import split_cores


def test_the_stages_split_the_cores_in_every_mode(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert split_cores(1) == ([0, 1], [2, 3])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {5})
    assert split_cores(1) == ([5], [5])


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
