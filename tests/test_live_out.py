"""``tandem run --live`` into a run directory it finds (``experiments.live_out``): a
finished run is not run again and its results are not rewritten; a resumed run's
progress bar counts the whole run."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from rich.console import Console

from experiments import cli
from experiments.cli import main
from policies.records import StepStats
from policies.results import RunResult
from policies.spec import load_spec
from policies.tracking import StepUpdate
from runtime import launcher, live_run
from runtime.recorder import DataPosition
from runtime.run_dir import RunDir

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"


def _checkpointed(out: Path, steps: int, samples_per_step: int = 0) -> None:
    """``out`` as a live run of live-tiny leaves it, checkpointed after ``steps`` steps
    that trained ``samples_per_step`` each (one history line a step)."""
    RunDir(out).prepare(load_spec(CONFIG))
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "last.pt").write_bytes(b"a checkpoint")
    samples = json.dumps([{"sample_id": i} for i in range(samples_per_step)])
    lines = "".join(f'{{"next_step":{n},"samples":{samples}}}\n' for n in range(1, steps + 1))
    (out / "checkpoints" / "history.jsonl").write_text(lines)


def _no_processes(*args) -> None:
    raise AssertionError("processes started")


def test_a_finished_run_run_again_rewrites_none_of_its_files(tmp_path, monkeypatch, capsys):
    """Before: the launcher found the run finished, and the CLI drew timeline.png again
    (and appended to run.log)."""
    out = tmp_path / "run"
    _checkpointed(out, 6)
    metrics = {"num_samples_trained": 192, "throughput_samples_per_s": 50.0}
    RunResult(load_spec(CONFIG), metrics, [], []).save(out, False)
    (out / "steps.json").write_text(json.dumps([{"step": i} for i in range(6)]))
    (out / "timeline.png").write_bytes(b"the run's plot")
    (out / "run.log").write_text("the run's log\n")
    files = sorted(p for p in out.rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in files}
    monkeypatch.setattr(launcher, "_run_processes", _no_processes)
    assert main(["run", str(CONFIG), "--live", "--out", str(out)]) == 0
    assert {p: p.read_bytes() for p in sorted(p for p in out.rglob("*") if p.is_file())} == before
    printed = " ".join(capsys.readouterr().out.split())
    assert f"{out} holds this run, finished: nothing run again or rewritten" in printed
    assert f"results in {out}" in printed


def test_a_finished_run_with_a_spec_that_changes_training_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    _checkpointed(out, 6)
    RunResult(load_spec(CONFIG), {}, [], []).save(out, False)
    (out / "steps.json").write_text(json.dumps([{"step": i} for i in range(6)]))
    code = main(["run", str(CONFIG), "--live", "--out", str(out), "--set", "run.seed=1"])
    assert code == 2
    printed = " ".join(capsys.readouterr().out.split())
    assert "this spec changes what is trained: run.seed (0 → 1)" in printed


def _resumed_bar(out: Path, monkeypatch, terminal: bool) -> str:
    """What the bar shows of a run into ``out`` resumed for one step (4 of 6), then Ctrl-C."""
    bar = io.StringIO()
    console = Console(file=bar, force_terminal=terminal, width=200)
    monkeypatch.setattr(cli, "err_console", console)

    def one_step_then_ctrl_c(spec, run_dir, predictor, after_step, on_step, *args) -> None:
        on_step(StepUpdate(StepStats(3, 4, 32, 320, 0.0, 1.0), (), ()))
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_run_processes", one_step_then_ctrl_c)
    assert main(["run", str(CONFIG), "--live", "--out", str(out)]) == 130
    return bar.getvalue()


def test_a_resumed_runs_bar_starts_at_its_checkpoint(tmp_path, monkeypatch):
    """Before: resumed after step 2 of 6, the bar showed 1/6 after its first step."""
    out = tmp_path / "run"
    _checkpointed(out, 3)
    shown = _resumed_bar(out, monkeypatch, terminal=True)
    assert "4/6" in shown and "1/6" not in shown


def test_a_resumed_runs_bar_counts_the_samples_of_the_whole_run(tmp_path, monkeypatch):
    """Before: resumed after 3 steps of 32 samples, the bar showed 4/6 steps but "32
    samples" after its first step, this part's only."""
    out = tmp_path / "run"
    _checkpointed(out, 3, samples_per_step=32)
    shown = _resumed_bar(out, monkeypatch, terminal=False)
    assert "4/6 steps · 128 samples" in " ".join(shown.split())  # not "4/6 steps · 32 samples"


def test_a_resumed_live_run_says_so_on_the_console_at_the_default_level(tmp_path, monkeypatch):
    """Before: ``resuming after step N`` went to run.log only (INFO): the console gave no
    sign that the run resumed rather than started again."""
    shown = io.StringIO()
    monkeypatch.setattr(cli, "err_console", Console(file=shown, width=400))
    ckpt = tmp_path / "run" / "checkpoints" / "last.pt"
    position = DataPosition(next_step=149, time_s=12.0, samples=[], spans=[], steps=[])
    monkeypatch.setattr(live_run, "resume_position", lambda path, loaded: position)

    class Trainer:
        async def initialise(self, path: str) -> DataPosition:
            return position

    cli.setup_logging("WARNING")  # the default --log-level
    try:
        asyncio.run(live_run._start_position(Trainer(), ckpt, 200))
    finally:
        cli.setup_logging("WARNING")  # the console handler on the real console again
    printed = " ".join(shown.getvalue().split())
    assert f"resuming after step 148 of 200 from {ckpt}" in printed
    assert "trainer loading the model" not in printed  # other INFO lines stay off it
