"""Without a terminal (CI, nohup) the progress bar prints a plain line now and then; at
the end of a run its status says that results are being written."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from experiments.progress import RunProgress
from policies.records import StepStats
from policies.tracking import StepUpdate


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _update(step: int) -> StepUpdate:
    stats = StepStats(step, step + 1, 8, 80, 0.0, 1.0, mean_reward=0.5, mean_lag=1.0)
    return StepUpdate(stats, (), ())


def _progress(terminal: bool) -> tuple[RunProgress, io.StringIO, Clock]:
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=terminal, width=200)
    return RunProgress(console, "r · sync", 3, plain_every_s=30.0, clock=clock), out, clock


def test_without_a_terminal_a_line_every_30_s():
    bar, out, clock = _progress(terminal=False)
    with bar:
        bar.on_step(_update(0))  # at once: too soon
        clock.now_s += 31
        bar.on_step(_update(1))
        clock.now_s += 10
        bar.status("writing results to runs/r…")  # 10 s after the last line: not yet
        clock.now_s += 25
        bar.status("writing trace.json (9 spans, 3 samples)…")
    lines = [line for line in out.getvalue().splitlines() if line.startswith("r · sync ·")]
    assert lines == [
        "r · sync · 2/3 steps · 16 samples · reward 0.500 · lag 1.00 · 31 s",
        "r · sync · 2/3 steps · 16 samples · reward 0.500 · lag 1.00 · writing trace.json "
        "(9 spans, 3 samples)… · 66 s",
    ]


def test_with_a_terminal_no_plain_lines():
    bar, out, clock = _progress(terminal=True)
    with bar:
        clock.now_s += 100
        bar.on_step(_update(0))
    assert "steps ·" not in out.getvalue()


def test_saving_says_writing_results(tmp_path, caplog):
    from helpers import small_spec

    from policies.results import RunResult

    with caplog.at_level(logging.INFO, logger="policies.results"):
        RunResult(small_spec(run__trace=False), {}, [], []).save(tmp_path)
    assert caplog.messages[0] == f"writing results to {tmp_path}…"


def test_a_resumed_run_counts_its_steps_from_where_it_resumed():
    """Before: a run resumed after step 2 of 6 counted 1/6 after its first step."""
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False, width=200)
    with RunProgress(console, "r · sync", 6, completed=3, plain_every_s=30.0, clock=clock) as bar:
        clock.now_s += 31
        bar.on_step(_update(3))
    lines = [line for line in out.getvalue().splitlines() if line.startswith("r · sync ·")]
    assert lines == ["r · sync · 4/6 steps · 8 samples · reward 0.500 · lag 1.00 · 31 s"]


def test_without_a_terminal_the_end_is_one_whole_line_not_a_bar_cut_at_80_columns():
    """Before: rich drew the bar once at the end, cut to 80 columns (``lag 0.…``)."""
    out, clock = io.StringIO(), Clock()
    console = Console(file=out, force_terminal=False, width=80)
    with RunProgress(console, "live-tiny · disagg-sync", 2, plain_every_s=30.0, clock=clock) as bar:
        bar.on_step(_update(0))
        bar.on_step(_update(1))
        clock.now_s += 12
        bar.status("stopping server 0")
    assert out.getvalue().splitlines() == [
        "live-tiny · disagg-sync · 2/2 steps · 16 samples · reward 0.500 · lag 1.00 · "
        "stopping server 0 · 12 s"
    ]
