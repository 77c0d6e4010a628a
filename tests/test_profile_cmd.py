"""``tandem profile`` without a server: its progress total and its checks before start."""

from __future__ import annotations

import runtime.profiler
from experiments.cli import main
from runtime.profiler import ProfilePlan


def test_the_progress_total_counts_every_tick():
    # ticks: server up, warm-up; per batch size a prefill and one decode per max_tokens;
    # train per size × repeats; weight pushes; contended decode per (batch, max_tokens)
    # and contended training per micro-batch
    assert ProfilePlan().num_measurements == 2 + 6 * 3 + 4 * 3 + 6 + 3 * 2 + 2
    small = ProfilePlan((1,), (24,), 1, (2,), 1, 1, (3,), (4,))
    assert small.num_measurements == 2 + 2 + 1 + 1 + 1 + 1


def test_a_missing_model_path_fails_before_anything_starts(tmp_path, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("started before the model directory was checked")

    monkeypatch.setattr(runtime.profiler, "start_server", refuse)
    monkeypatch.setattr(runtime.profiler, "TrainerProcess", refuse)
    out = tmp_path / "prof"
    code = main(["profile", "--set", "model.path=/nonexistent", "--out", str(out)])
    assert code == 2
    assert "model.path /nonexistent does not exist" in " ".join(capsys.readouterr().out.split())
    assert not out.exists()
