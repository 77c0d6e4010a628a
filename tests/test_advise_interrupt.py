"""Ctrl-C or SIGTERM during ``tandem advise`` keeps what ran. Seen: SIGINT after 54 short
and 19 full runs printed "interrupted", exit 130, and ``--out`` did not exist."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest
import yaml

import experiments.advise
from experiments.cli import main
from tests.test_advise import AXES
from tests.test_advise_bounds import _TpOneWins
from tests.test_advise_space import small_spec


class _StoppedAfter(_TpOneWins):
    """Sends this process ``signum`` as it is asked for its ``num_runs + 1``-th run."""

    def __init__(self, signum: int, num_runs: int) -> None:
        self.signum, self.left = signum, num_runs

    def submit(self, c, iterations):  # noqa: ANN001, ANN201 - the Evaluator protocol
        if self.left == 0:
            os.kill(os.getpid(), self.signum)
        self.left -= 1
        return super().submit(c, iterations)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_advise_writes_the_runs_so_far_marked_partial(
    signum, code, tmp_path, monkeypatch
):
    stopper = _StoppedAfter(signum, 6)
    monkeypatch.setattr(experiments.advise, "PoolEvaluator", lambda *args: stopper)
    spec = tmp_path / "small.yaml"
    spec.write_text(small_spec().to_yaml())
    out = tmp_path / "out"
    axes = sum((["--axis", a] for a in (*AXES, "mode=stream-async,pipeline", "tp=1,2")), [])
    assert main(["advise", str(spec), "--out", str(out), "--workers", "1", *axes]) == code
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "partial" and status["num_simulations"] == 6
    runs = pd.read_csv(out / "evaluations.csv")
    assert len(runs) == 6 and runs["is_input"].iloc[0] and runs["kind"].iloc[0] == "full"
    best = yaml.safe_load((out / "best.yaml").read_text())  # the best full run so far
    assert best["run"]["name"] == "small"
    text = (out / "advice.md").read_text()
    assert "PARTIAL" in text and "not advice" in text
    assert not (out / "pareto.csv").exists()
    # the same command again, to its end: the advice, complete
    monkeypatch.setattr(
        experiments.advise, "PoolEvaluator", lambda *args: _StoppedAfter(signum, 10**9)
    )
    assert main(["advise", str(spec), "--out", str(out), "--workers", "1", *axes]) == 0
    assert json.loads((out / "status.json").read_text())["status"] == "complete"
    assert "PARTIAL" not in (out / "advice.md").read_text()


def test_stopped_before_any_run_ended_it_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(
        experiments.advise, "PoolEvaluator", lambda *a: _StoppedAfter(signal.SIGINT, 0)
    )
    spec = tmp_path / "small.yaml"
    spec.write_text(small_spec().to_yaml())
    out = tmp_path / "out"
    assert (
        main(["advise", str(spec), "--out", str(out), "--workers", "1", "--axis", AXES[0]]) == 130
    )
    assert json.loads((out / "status.json").read_text())["num_simulations"] == 0
    assert not (out / "best.yaml").exists()
    assert "no full run inside the space ended" in (out / "advice.md").read_text()


def test_a_budget_that_ends_before_any_full_run_is_an_error_that_keeps_what_ran(tmp_path, capsys):
    # seen: an uncaught RuntimeError, a traceback and exit 1, and nothing in --out
    spec = tmp_path / "small.yaml"
    spec.write_text(small_spec().to_yaml())
    out = tmp_path / "out"
    args = ["advise", str(spec), "--out", str(out), "--workers", "1", "--budget-s", "0.001"]
    assert main([*args, "--axis", AXES[0]]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert "error: --budget-s 0.001: no candidate finished a full run within it; raise it" in said
    assert json.loads((out / "status.json").read_text())["status"] == "partial"
    assert "The budget ran out before any full run ended" in (out / "advice.md").read_text()
