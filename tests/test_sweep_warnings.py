"""A sweep says each warning once: its points' checks say what every point will warn of,
and each point's run keeps those to its run.log instead of printing them again from its
worker (seen: the offload warning once from the checks, then once more for every point)."""

from __future__ import annotations

import logging

from helpers import small_spec

from experiments import cli
from experiments.cli import main
from experiments.sweep import parse_grid, run_sweep
from experiments.sweep_point import WARNINGS, run_point

OFFLOADED = "only with the optimizer offloaded"


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_a_sweep_prints_the_offload_warning_once_and_each_point_logs_it(
    tmp_path, capfd, monkeypatch
):
    monkeypatch.setattr(cli.err_console, "width", 400)  # one line a message
    path = tmp_path / "spec.yaml"
    path.write_text(small_spec(cluster__trainer__num_gpus=1).to_yaml())
    out = tmp_path / "sweep"
    assert main(["sweep", str(path), "--grid", "run.seed=1,2,3", "--workers", "1",
                 "--out", str(out)]) == 0  # fmt: skip
    said = capfd.readouterr()
    assert _flat(said.out + said.err).count(OFFLOADED) == 1
    for i in range(3):
        assert OFFLOADED in (out / "points" / f"{i:04d}" / "run.log").read_text()
    assert WARNINGS not in (out / "results.csv").read_text().splitlines()[0].split(",")


def test_a_points_run_hands_its_warnings_back_instead_of_printing_them(tmp_path, capfd):
    base = small_spec(cluster__trainer__num_gpus=1)
    row = run_point(base, {"run.seed": 1}, tmp_path / "point")
    assert row["error"] is None
    assert len(row[WARNINGS]) == 1 and OFFLOADED in row[WARNINGS][0]
    assert OFFLOADED not in capfd.readouterr().err
    assert WARNINGS not in run_point(small_spec(), {"run.seed": 1}, None)


def test_a_warning_the_checks_did_not_say_is_said_once_naming_a_point(tmp_path, caplog):
    base = small_spec(cluster__trainer__num_gpus=1)
    with caplog.at_level(logging.WARNING):
        run_sweep(base, [parse_grid("run.seed=1,2")], tmp_path / "a", workers=1, quiet=True)
    assert caplog.text.count(OFFLOADED) == 1 and "grid point 0" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_sweep(base, [parse_grid("run.seed=1,2")], tmp_path / "b", workers=1, quiet=True,
                  warned=run_point(base, {"run.seed": 1}, None)[WARNINGS])  # fmt: skip
    assert OFFLOADED not in caplog.text
