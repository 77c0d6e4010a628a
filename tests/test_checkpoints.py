"""Per-step checkpoints kept beside ``last.pt``: bounded, and unchanged by later writes."""

from __future__ import annotations

import pytest

from policies.results import write_atomic
from runtime.checkpoints import keep_step, kept_steps, last_checkpoint, step_checkpoint


def _write_steps(run_dir, steps: range, keep: int) -> None:
    last = last_checkpoint(run_dir)
    for step in steps:
        write_atomic(last, f"weights of step {step}".encode())  # as the trainer writes it
        keep_step(last, step, keep)


def test_the_newest_steps_are_kept_and_older_ones_deleted(tmp_path):
    _write_steps(tmp_path, range(5), keep=2)
    assert kept_steps(tmp_path / "checkpoints") == [3, 4]
    assert step_checkpoint(tmp_path, 3).read_bytes() == b"weights of step 3"  # not overwritten
    assert step_checkpoint(tmp_path, 4).stat().st_ino == last_checkpoint(tmp_path).stat().st_ino
    assert not list((tmp_path / "checkpoints").glob(".*"))  # no temporary files left


def test_keep_zero_keeps_only_last(tmp_path):
    _write_steps(tmp_path, range(3), keep=1)
    _write_steps(tmp_path, range(3, 4), keep=0)
    assert kept_steps(tmp_path / "checkpoints") == []
    assert last_checkpoint(tmp_path).read_bytes() == b"weights of step 3"


def test_export_names_what_is_missing(tmp_path):
    from runtime.export import export_policy

    (tmp_path / "spec.yaml").write_text("run: {name: x}\n")
    with pytest.raises(ValueError, match="no checkpoints/last.pt"):
        export_policy(tmp_path, tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="--out .* not an empty directory"):
        export_policy(tmp_path, tmp_path / "out")
