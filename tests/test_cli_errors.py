"""A failed command's last layer: one line, an exit code, no empty ``--out`` left behind."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from experiments.cli import main
from experiments.cli_errors import run_handler
from experiments.stop_signal import SigtermUnwinds


def test_a_failed_command_removes_the_out_directories_it_made(tmp_path: Path, capsys) -> None:
    out = tmp_path / "new" / "cal"
    code = main(["calibrate", str(tmp_path / "no-profile"), "--out", str(out)])
    assert code == 2
    assert "no-profile: no such directory" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "new").exists()  # out and the parent made for it are gone


def test_a_failed_command_keeps_an_out_directory_that_was_there(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    assert main(["calibrate", str(tmp_path / "no-profile"), "--out", str(out)]) == 2
    assert out.is_dir()


def test_a_failed_command_keeps_what_it_wrote(tmp_path: Path) -> None:
    out = tmp_path / "made" / "out"

    def writes_then_fails(args: argparse.Namespace) -> int:
        out.mkdir(parents=True)
        (out / "rows.csv").write_text("a\n1\n")
        raise ValueError("bad value")

    args = argparse.Namespace(out=str(out), command="x")
    with SigtermUnwinds() as stop:
        assert run_handler(writes_then_fails, args, stop, Console()) == 2
    assert (out / "rows.csv").read_text() == "a\n1\n"


def _stopped_live_run(tmp_path: Path, monkeypatch, capsys, checkpointed: bool) -> tuple[int, str]:
    """``tandem run live-tiny --live`` interrupted mid-run (Ctrl-C), its checkpoint written
    or not: the exit code and what it printed."""
    from runtime import launcher

    out = tmp_path / "run"

    def interrupted(spec, run_dir, *args) -> None:
        if checkpointed:
            run_dir.checkpoint.parent.mkdir(parents=True)
            run_dir.checkpoint.write_bytes(b"a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(launcher, "_run_processes", interrupted)
    code = main(["run", "live-tiny", "--live", "--out", str(out)])
    return code, " ".join(capsys.readouterr().out.split())


def test_a_stopped_live_run_with_a_checkpoint_prints_its_resume_command(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    code, printed = _stopped_live_run(tmp_path, monkeypatch, capsys, checkpointed=True)
    out = tmp_path / "run"
    assert code == 130
    assert printed == f"interrupted; resume with: tandem run {out}/spec.yaml --live --out {out}"


def test_a_live_run_stopped_before_its_first_checkpoint_says_it_starts_again_from_step_0(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """Before: just "interrupted", where a run that failed there said how to go on."""
    code, printed = _stopped_live_run(tmp_path, monkeypatch, capsys, checkpointed=False)
    out = tmp_path / "run"
    assert code == 130
    assert printed == (
        "interrupted; no step was checkpointed yet: running it again starts from step 0: "
        f"tandem run {out}/spec.yaml --live --out {out}"
    )
    assert (out / "spec.yaml").is_file()  # the command it names runs the same spec
    last = (out / "run.log").read_text().splitlines()[-1]
    assert last.endswith("no step was checkpointed yet: running it again starts from step 0: "
                         f"tandem run {out}/spec.yaml --live --out {out}")  # fmt: skip


def test_run_log_says_why_an_interrupted_run_stopped(tmp_path: Path, monkeypatch, capsys) -> None:
    """Before: ``RunInterrupted: ; resume with …``: Ctrl-C's interrupt says nothing itself."""
    _stopped_live_run(tmp_path, monkeypatch, capsys, checkpointed=True)
    out = tmp_path / "run"
    last = (out / "run.log").read_text().splitlines()[-1]
    assert last.endswith(
        f"the run stopped: RunInterrupted: interrupted; resume with: "
        f"tandem run {out}/spec.yaml --live --out {out}"
    )
