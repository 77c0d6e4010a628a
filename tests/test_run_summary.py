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
    said = " ".join(printed.split())
    assert "hardware.csv and sim.hardware have no cost_per_machine_rel_h20 for H100-SXM" in said
    assert said.count("have no cost_per_machine_rel_h20") == 1


def test_a_run_on_priced_hardware_prints_no_cost_line(tmp_path, capsys):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    assert main(["run", str(spec), "--out", str(tmp_path / "run")]) == 0
    assert "cost_per_machine_rel_h20" not in capsys.readouterr().out


def _summary_lines(metrics: dict, tmp_path, capsys) -> list[str]:
    print_summary(RunResult(load_spec(None), metrics, [], []), tmp_path, cli.console)
    return capsys.readouterr().out.splitlines()


def test_a_ranked_runs_summary_says_how_well_the_ranker_ranked_in_one_line(tmp_path, capsys):
    """Seen: ranker Spearman 0.290 and top-20 % recall 0.388 only in run.log and metrics.json."""
    quality = {"ranker_spearman": 0.2904, "ranker_recall_20": 0.3877, "ranker_recall_10": 0.2,
               "ranker_recall_5": 0.1, "ranker_predicted_share": 1.0, "ranker_num_iterations": 9}  # fmt: skip
    lines = _summary_lines({"throughput_samples_per_s": 1.0, **quality}, tmp_path, capsys)
    ranker = [line for line in lines if line.startswith("ranker:")]
    assert ranker == ["ranker: Spearman 0.290, recall of the longest 20 % 0.388 (more in run.log)"]
    unmeasured = {**quality, "ranker_num_iterations": 0}
    assert any(
        line.startswith("ranker: nothing to measure")
        for line in _summary_lines(unmeasured, tmp_path, capsys)
    )
    assert not any("ranker" in line for line in _summary_lines({}, tmp_path, capsys))


def test_a_ranked_run_prints_the_quality_its_metrics_json_holds(tmp_path, capsys):
    import json

    spec = tmp_path / "tiny.yaml"
    spec.write_text(SMALL_YAML)
    given = ["--set", "policies.length_predictor=ranker", "--out", str(tmp_path / "run")]
    assert main(["run", str(spec), *given]) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert f"ranker: Spearman {metrics['ranker_spearman']:.3f}, " in capsys.readouterr().out
