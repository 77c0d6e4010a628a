"""The offload warning is about the trainer that runs: where ``policies.allocation``
re-splits the cluster (``balanced``) it names the trainer the allocation left, not the
spec's ``cluster.trainer.num_gpus``. Before: ``streamrl-72b`` with 8 trainer GPUs under
``balanced`` warned that 8 H800 GPUs hold its state only offloaded, though 52 ran."""

from __future__ import annotations

from helpers import small_spec

from experiments.specs import config_path
from policies.spec import load_spec
from sim.cluster import check_sim_run

OFFLOADED = "only with the optimizer offloaded"


def _72b(allocation: str) -> list[str]:
    overrides = ["cluster.trainer.num_gpus=8", f"policies.allocation={allocation}"]
    return check_sim_run(load_spec(config_path("streamrl-72b"), overrides))


def test_balanced_does_not_warn_about_the_spec_trainer_it_replaced():
    assert not [w for w in _72b("balanced") if OFFLOADED in w]  # it runs 52 trainer GPUs


def test_fixed_still_warns_about_the_spec_trainer_that_runs():
    (warning,) = [w for w in _72b("fixed") if OFFLOADED in w]
    assert warning.startswith("cluster.trainer.num_gpus: 8 H800 GPU(s) hold Qwen2.5-72B's")


def test_balanced_warns_about_the_trainer_it_leaves():
    spec = small_spec(policies__allocation="balanced", cluster__generation__0__num_gpus=2,
                      cluster__trainer__num_gpus=1)  # fmt: skip
    (warning,) = check_sim_run(spec)  # balanced leaves 1 of 3 to the trainer (7B: 2 hold it)
    assert warning.startswith("policies.allocation balanced's trainer: 1 H800 GPU(s) hold")
    assert OFFLOADED in warning and "2 hold it all" in warning
