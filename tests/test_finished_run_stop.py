"""A stop signal after a run saved its results (``runtime.graceful_stop``,
``StopRequests.results_saved``): the run finished, and the signal only ends its shutdown.
Before, Ctrl-C in the last second of a live run, after ``live run done … results in``,
printed ``interrupted`` and exited 130, ``run.log`` said ``the run stopped:
KeyboardInterrupt`` and tracking ``the run ended KILLED``, no summary, though every result
file was written (and running it again said the run was finished)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from experiments import plots
from experiments.cli import main
from policies.results import RunResult
from runtime import launcher
from runtime.graceful_stop import StopRequests

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"
METRICS = {"num_samples_trained": 192, "throughput_samples_per_s": 50.0}


def _finished(spec, run_dir, *args) -> RunResult:
    """A live run that trained and saved every step (what ``drive`` leaves)."""
    run_dir.checkpoint.parent.mkdir(parents=True)
    run_dir.checkpoint.write_bytes(b"a checkpoint")
    result = RunResult(spec, METRICS, [], [])
    result.save(run_dir.path, write_spec=False)
    (run_dir.path / "steps.json").write_text(json.dumps([{"step": i} for i in range(6)]))
    return result


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_while_a_finished_live_run_shuts_down_leaves_it_finished(
    sig, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "run"
    plotted: list[Path] = []

    def timeline_then_signal(result, path) -> None:  # the CLI's shutdown, results saved
        signal.raise_signal(sig)
        plotted.append(path)  # the shutdown went on

    monkeypatch.setattr(launcher, "_run_processes", _finished)
    monkeypatch.setattr(plots, "timeline", timeline_then_signal)
    code = main(["run", str(CONFIG), "--live", "--out", str(out)])
    printed = " ".join(capsys.readouterr().out.split())
    assert code == 0, printed
    assert plotted == [out / "timeline.png"]
    assert f"results in {out}" in printed and "interrupted" not in printed
    logged = (out / "run.log").read_text()
    assert "the run stopped" not in logged and "ended KILLED" not in logged


def test_a_signal_after_the_results_are_saved_is_noted_and_a_second_unwinds():
    with StopRequests(grace_s=60.0) as stops:
        stops.results_saved()
        signal.raise_signal(signal.SIGINT)  # noted: the shutdown goes on
        assert stops.late_signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # again: at once
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_before_its_results_are_saved_a_signal_still_unwinds_the_run():
    with pytest.raises(KeyboardInterrupt), StopRequests(grace_s=60.0) as stops:
        signal.raise_signal(signal.SIGINT)
    assert stops.late_signum is None
