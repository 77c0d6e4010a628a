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
    assert "no profile.json" in " ".join(capsys.readouterr().out.split())
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
