"""``tandem reproduce``'s report: the max-lag verdict knows what a run's length can show,
and the commit it names is tandem's own, whatever the working directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from experiments.reproduce.pipelinerl import QUICK, max_lag_verdict
from experiments.reproduce.report import PACKAGE_ROOT, git_commit, max_verdict

REPO = Path(__file__).resolve().parents[1]


def test_a_quick_run_too_short_for_the_formula_is_not_checked() -> None:
    """The user trial: formula 13, 8 steps (lags 0..7 only), observed 7."""
    verdict = max_lag_verdict(13, 7, max_lag=31, num_steps=QUICK.pipeline_iterations)
    assert verdict == "not checked: the run's 8 steps cap the observable lag at 7"


@pytest.mark.parametrize(
    ("estimate", "observed", "max_lag", "num_steps", "verdict"),
    [
        (13, 13, 31, 32, "consistent"),
        (13, 25, 31, 32, "we disagree"),  # far above the formula
        (13, 5, 31, 32, "we disagree"),  # far below it, with room to show more
        (13, 7, 7, 32, "not checked: max_lag = 7 caps the observable lag at 7"),
        (13, 14, 14, 32, "not checked: max_lag = 14 caps the observable lag at 14"),
        (13, 12, 14, 32, "consistent"),  # below the cap: the run's own max lag
        (13, 14, 31, 15, "not checked: the run's 15 steps cap the observable lag at 14"),
        (13, 15, 31, 16, "we disagree"),  # at its cap, yet already above the tolerance
    ],
)
def test_max_lag_verdict(
    estimate: int, observed: int, max_lag: int, num_steps: int, verdict: str
) -> None:
    assert max_lag_verdict(estimate, observed, max_lag, num_steps) == verdict


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}  # fmt: skip
    run = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_commit_is_tandems_not_the_working_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "commit", "-q", "--allow-empty", "-m", "unrelated")
    other = _git(tmp_path, "rev-parse", "--short", "HEAD")
    ours = _git(REPO, "rev-parse", "--short", "HEAD")
    assert PACKAGE_ROOT == REPO
    monkeypatch.chdir(tmp_path)
    assert git_commit() == ours != other


def test_the_commit_is_unknown_outside_a_checkout_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    assert git_commit(tmp_path / "pkg") == "unknown"  # not a checkout
    assert git_commit(REPO / "experiments") == "unknown"  # inside one, not at its top


def test_the_default_folder_of_a_quick_report_is_documented_as_it_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seen: ``--help`` and docs/reproduce.md said runs/reproduce-STUDY for --quick too."""
    import experiments.reproduce
    from experiments.cli import main

    written = []
    monkeypatch.setattr(
        experiments.reproduce, "reproduce", lambda study, out, *a: written.append(out) or out
    )
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "streamrl", "--quick"]) == 0
    assert written == [Path("runs/reproduce-streamrl-quick")]
    with pytest.raises(SystemExit):
        main(["reproduce", "--help"])
    helped = " ".join(capsys.readouterr().out.split())
    docs = " ".join((REPO / "docs" / "reproduce.md").read_text().split())
    for text in (helped, docs):
        assert "runs/reproduce-STUDY-quick" in text


def test_the_reports_cite_the_papers_not_files_outside_the_repository() -> None:
    """The reports cited ``shared/data/...``, which a clone of the repository lacks."""
    from experiments.reproduce import pipelinerl, streamrl

    for intro, paper in (
        (streamrl.INTRO, "arXiv 2504.15930"),
        (pipelinerl.INTRO, "arXiv 2509.19128"),
    ):
        text = " ".join(intro)
        assert "shared/" not in text and paper in text
    for report in ("streamrl", "pipelinerl"):
        assert "shared/data" not in (REPO / "docs" / "reports" / report / "report.md").read_text()


@pytest.mark.parametrize(
    ("ours", "published", "verdict"),
    [
        ([1.0, 1.07], 1.25, "we disagree (ours lower)"),  # overlaps [1, 1.25], falls short
        ([1.05, 1.2], 1.25, "consistent (largest within 10%)"),
        ([1.29, 1.63], 1.33, "we disagree (ours higher)"),  # overlaps 1.23-1.33, overshoots
    ],
)
def test_an_up_to_claim_is_judged_by_our_largest(
    ours: list[float], published: float, verdict: str
) -> None:
    assert max_verdict(ours, published) == verdict
