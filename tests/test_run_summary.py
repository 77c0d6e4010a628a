"""``tandem run``'s summary table: counts as integers, and one line saying why
``cost_normalized_throughput`` is "—" (the hardware hardware.csv prices no machine of)."""

from __future__ import annotations

import pytest
from helpers import SMALL_YAML

from experiments import cli
from experiments.cli import main
from experiments.summary_format import print_summary
from policies.results import METRIC_NAMES, RunResult
from policies.spec import load_spec


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    monkeypatch.setattr(cli.console, "width", 400)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (10240, "10240"),  # before: 1.024e+04
        (0, "0"),
        (0.0, "0"),
        (6.3821, "6.382"),
        (12345.678, "12345.7"),  # before: 1.235e+04
        (0.00012, "1.200e-04"),
        (None, "—"),
    ],
)
def test_a_metric_is_written_readably(value, shown):
    from experiments.summary_format import format_metric

    assert format_metric(value) == shown


def test_the_summary_prints_counts_as_integers(tmp_path, capsys):
    """Before: ``num_samples_trained`` 10240 was printed ``1.024e+04``."""
    metrics = {name: 0.5 for name in METRIC_NAMES} | {
        "num_samples_trained": 10240, "max_staleness": 3, "makespan_s": 12345.678,
        "cost_normalized_throughput": 0.334, "sim_wall_s": 1.0,
    }  # fmt: skip
    print_summary(RunResult(load_spec(None), metrics, [], []), tmp_path, cli.console)
    rows = dict(line.split()[1:4:2] for line in capsys.readouterr().out.splitlines()
                if line.startswith("│ num_samples_trained"))  # fmt: skip
    assert rows == {"num_samples_trained": "10240"}


def test_a_run_on_unpriced_hardware_says_which_hardware_lacks_a_cost(tmp_path, capsys):
    """Before: the row showed "—" and nothing said why."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    given = ["--set", "cluster.trainer.hardware=H100-SXM", "--out", str(tmp_path / "run")]
    assert main(["run", str(spec), *given]) == 0
    printed = capsys.readouterr().out
    assert "hardware.csv has no cost_per_machine_rel_h20 for H100-SXM" in printed
    assert printed.count("cost_per_machine_rel_h20") == 1


def test_a_run_on_priced_hardware_prints_no_cost_line(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    assert main(["run", str(spec), "--out", str(tmp_path / "run")]) == 0
    assert "cost_per_machine_rel_h20" not in capsys.readouterr().out
