"""A split given to a run under ``policies.allocation: balanced`` is replaced, and the run
says so: one warning line (only where the command line gave a GPU count), and the split
that ran in the summary, metrics.json and a sweep's results.csv. Before: a sweep over
``cluster.generation.0.num_gpus=8,16,24`` reported 8/16/24 and ran 11/13, 18/14, 25/15,
saying nothing."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml
from helpers import small_spec

from experiments import cli
from experiments.cli import main
from policies.given_split import replaced_split, split_keys_given
from policies.results import SIM_METRICS

SMALL = ["--set", "algorithm.batch_size=64", "--set", "workload.max_output_tokens=2000",
         "--set", "run.iterations=1"]  # fmt: skip
GEN, TRAIN = "cluster.generation.0.num_gpus", "cluster.trainer.num_gpus"
WARNED = "under policies.allocation balanced sets only the pool's total"


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    monkeypatch.setattr(cli.err_console, "width", 400)
    monkeypatch.setattr(cli.console, "width", 400)


def _ran(run_dir) -> tuple[int, int]:
    """The split a run's spec.yaml records (the cluster as allocated)."""
    cluster = yaml.safe_load((run_dir / "spec.yaml").read_text())["cluster"]
    return cluster["generation"][0]["num_gpus"], cluster["trainer"]["num_gpus"]


def test_the_split_metrics_are_in_every_simulated_runs_metrics():
    assert {"generation_gpus", "trainer_gpus"} <= set(SIM_METRICS)


def test_a_run_given_a_count_under_balanced_warns_and_shows_the_split_that_ran(tmp_path, capfd):
    out = tmp_path / "run"
    assert main(["run", "streamrl-7b", *SMALL, "--set", f"{GEN}=8", "--out", str(out)]) == 0
    said = capfd.readouterr()
    text = _flat(said.out + said.err)
    assert text.count(WARNED) == 1
    assert f"{GEN} {WARNED} (24 GPUs)" in text
    assert "--set policies.allocation=fixed keeps the split given" in text
    gen, train = _ran(out)
    assert (gen, train) != (8, 16) and gen + train == 24  # balanced re-split the 24
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["generation_gpus"], metrics["trainer_gpus"]) == (gen, train)
    assert f"│ generation_gpus │ {gen} │" in _flat(said.out)
    assert f"│ trainer_gpus │ {train} │" in _flat(said.out)
    assert WARNED in (out / "run.log").read_text()


@pytest.mark.parametrize(
    "given",
    [
        [],  # the shipped config's own counts
        ["--set", f"{GEN}=8", "--set", "policies.allocation=fixed"],
    ],  # fmt: skip
)
def test_no_warning_without_a_count_given_or_under_fixed(tmp_path, capfd, given):
    out = tmp_path / "run"
    assert main(["run", "streamrl-7b", *SMALL, *given, "--out", str(out)]) == 0
    said = capfd.readouterr()
    assert "policies.allocation balanced" not in _flat(said.out + said.err)
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["generation_gpus"], metrics["trainer_gpus"]) == _ran(out)
    if given:
        assert _ran(out) == (8, 16)


def test_a_sweep_warns_once_and_its_table_gives_the_split_that_ran(tmp_path, capfd):
    out = tmp_path / "sweep"
    grid = ["--grid", f"{GEN}=8,16", "--workers", "1", "--out", str(out)]
    assert main(["sweep", "streamrl-7b", *SMALL, *grid]) == 0
    said = capfd.readouterr()
    assert _flat(said.out + said.err).count(WARNED) == 1
    assert f"{GEN} {WARNED} (24, 32 GPUs)" in _flat(said.err)
    table = pd.read_csv(out / "results.csv")
    assert list(table[GEN]) == [8, 16]  # what was asked
    ran = [_ran(out / "points" / f"{i:04d}") for i in range(2)]
    assert list(zip(table["generation_gpus"], table["trainer_gpus"])) == ran  # what ran
    assert ran[0] != (8, 16)


@pytest.mark.parametrize(
    ("overrides", "keys"),
    [
        ([f"{GEN}=8", "run.seed=3"], [GEN]),
        ([f"{TRAIN}=8", f"{GEN}=8"], [TRAIN, GEN]),
        (["cluster.trainer={hardware: H800, num_gpus: 8}"], [TRAIN]),
        (["cluster.generation=[{num_gpus: 4}, {num_gpus: 2}]"],
         ["cluster.generation.0.num_gpus", "cluster.generation.1.num_gpus"]),
        (["cluster.generation.0.tp=2", "policies.allocation=balanced"], []),
    ],
)  # fmt: skip
def test_the_counts_given_are_found_in_sections_too(overrides, keys):
    assert split_keys_given(overrides) == keys


def test_the_warning_depends_on_the_allocation_mode_and_placement():
    balanced = small_spec(policies__allocation="balanced")
    assert replaced_split([balanced], []) == []  # nothing given
    assert replaced_split([small_spec()], [GEN]) == []  # fixed
    colocated = small_spec(policies__allocation="balanced", pipeline__mode="colocated-sync")
    assert replaced_split([colocated], [GEN]) == []  # every GPU is both stages' anyway
    [line] = replaced_split([balanced], [GEN, TRAIN])
    assert line.startswith(f"{GEN} and {TRAIN} under policies.allocation balanced set only "
                           "the pool's total (4 GPUs)")  # fmt: skip
    apart = small_spec(policies__allocation="balanced", cluster__trainer__datacenter="dc1")
    [line] = replaced_split([apart], [TRAIN])
    assert "different datacenters or on different hardware, is the most a stage gets" in line
