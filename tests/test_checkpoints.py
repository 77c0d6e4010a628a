"""Per-step checkpoints kept beside ``last.pt`` (or ``last.dcp``): bounded, unchanged by
later writes; a directory is published so that a crash leaves the last good one."""

from __future__ import annotations

import shutil

import pytest

from policies.results import write_atomic
from runtime.checkpoints import (
    CheckpointCadence,
    keep_step,
    kept_checkpoints,
    kept_steps,
    last_checkpoint,
    publish_dir,
    readable,
    step_checkpoint,
)


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

    with pytest.raises(ValueError, match="not a run directory .no spec.yaml"):
        export_policy(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "spec.yaml").write_text("run: {name: x}\n")
    with pytest.raises(ValueError, match="no checkpoints/last.pt"):
        export_policy(tmp_path, tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="--out .* not an empty directory"):
        export_policy(tmp_path, tmp_path / "out")


def test_export_into_a_read_only_directory_names_out_not_its_temporary_name(tmp_path, monkeypatch):
    """Before: ``[Errno 30] Read-only file system: '.../ro/.out.export-x1y2'``, a traceback."""
    import errno
    import os

    import torch

    import runtime.export as export

    def read_only(dir: str, prefix: str) -> str:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), f"{dir}/{prefix}x1y2")

    (tmp_path / "spec.yaml").write_text(f"run: {{name: x}}\nmodel: {{path: {tmp_path}}}\n")
    (tmp_path / "checkpoints").mkdir()
    torch.save({"version": 1, "model": {}}, tmp_path / "checkpoints" / "last.pt")
    monkeypatch.setattr(export.tempfile, "mkdtemp", read_only)
    out = tmp_path / "ro" / "out"
    with pytest.raises(ValueError) as err:
        export.export_policy(tmp_path, out)
    assert str(err.value) == f"--out {out}: cannot write in {out.parent}: Read-only file system"


def _write_dir(folder, text: str) -> None:
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_text(text)
    (folder / ".metadata").write_text(text)


def test_a_kept_directory_is_hard_linked_and_survives_the_next_publish(tmp_path):
    last = tmp_path / "checkpoints" / "last.dcp"
    for step in range(3):
        tmp = last.with_name(".last.dcp.tmp")
        _write_dir(tmp, f"shards of step {step}")
        publish_dir(tmp, last)
        keep_step(last, step, keep=2)
    assert kept_steps(last.parent) == [1, 2]
    step1 = kept_checkpoints(last.parent)[1]
    assert step1.name == "step-000001.dcp"
    assert (step1 / "__0_0.distcp").read_text() == "shards of step 1"
    step2 = last.parent / "step-000002.dcp" / "__0_0.distcp"
    assert step2.stat().st_ino == (last / "__0_0.distcp").stat().st_ino
    assert sorted(p.name for p in last.parent.iterdir()) == [
        "last.dcp", "step-000001.dcp", "step-000002.dcp",
    ]  # fmt: skip


def test_a_publish_stopped_between_its_renames_leaves_the_previous_checkpoint(tmp_path):
    last = tmp_path / "last.dcp"
    _write_dir(last.with_name(".last.dcp.old"), "previous")  # moved aside, then a crash
    _write_dir(last.with_name(".last.dcp.tmp"), "half")
    assert readable(last) == last.with_name(".last.dcp.old")
    tmp = last.with_name(".last.dcp.tmp")
    shutil.rmtree(tmp)  # as the next save starts
    _write_dir(tmp, "next")
    publish_dir(tmp, last)
    assert readable(last) == last
    assert (last / ".metadata").read_text() == "next"
    assert [p.name for p in tmp_path.iterdir()] == ["last.dcp"]
    assert readable(tmp_path / "missing.dcp") is None


def test_a_cadence_skips_steps_within_its_interval_but_never_the_last():
    # steps 0.1 s apart, a checkpoint every 2nd step, at most one a 0.35 s, 12 steps
    cadence = CheckpointCadence(every=2, min_interval_s=0.35, num_steps=12)
    due = [step for step in range(12) if cadence.due(step, 0.1 * (step + 1))]
    assert due == [3, 7, 11]  # 0.4 s, 0.8 s (0.4 after), and the last, although 0.4 after
    plain = CheckpointCadence(every=3, num_steps=10)  # no interval: every 3rd, and the last
    # (before: 9 was not due, so a finished run's export gave step 8's weights)
    assert [step for step in range(10) if plain.due(step, 0.0)] == [2, 5, 8, 9]
    resumed = CheckpointCadence(every=1, min_interval_s=5.0, num_steps=100)
    assert resumed.due(40, 61.0) and not resumed.due(41, 62.0)  # timed from the last one
