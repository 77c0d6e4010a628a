"""The run's history journal beside its checkpoints (runtime.history): each checkpoint
appends only what is new, and a resume rebuilds the whole position from it."""

from __future__ import annotations

import json
import pickle

import pytest
from helpers import completion, request

from policies.records import SpanKind
from policies.resources import TRAINER
from runtime.history import HistoryJournal, journal_path
from runtime.recorder import DataPosition, Recorder


def _checkpointed_run(tmp_path, num_steps: int, per_step: int = 4):
    rec = Recorder()
    journal = HistoryJournal(journal_path(tmp_path / "checkpoints" / "last.pt"))
    slims = []
    for step in range(num_steps):
        ids = list(range(step * per_step, (step + 1) * per_step))
        for i in ids:
            rec.sent(0, float(i))
            rec.completion(completion(request(i), 0, float(i) + 0.5))
            rec.returned(0, float(i) + 0.5, step)
        rec.trained(ids, step)
        rec.span(TRAINER, SpanKind.TRAIN, step, step + 0.5, iteration=step)
        rec.steps.append({"step": step})
        delta = rec.journal_delta(step, step + 1.0)
        journal.append(delta)
        slims.append(DataPosition(delta.next_step, delta.time_s, [], [], [], journal=True))
    return rec, journal, slims


def test_each_checkpoint_appends_only_what_is_new(tmp_path):
    rec, journal, slims = _checkpointed_run(tmp_path, 5)
    lines = [json.loads(x) for x in journal.path.read_text().splitlines()]
    assert [len(x["samples"]) for x in lines] == [4] * 5  # not 4, 8, 12, ...
    assert [[s["sample_id"] for s in x["samples"]] for x in lines][2] == [8, 9, 10, 11]
    assert [len(x["steps"]) for x in lines] == [1] * 5
    # the checkpoint's own position stays the same size however long the run
    sizes = {len(pickle.dumps(s.to_dict())) for s in slims}
    assert max(sizes) - min(sizes) <= 2  # a digit more in next_step / time_s at most


def test_a_resume_rebuilds_the_whole_position_up_to_its_checkpoint(tmp_path):
    rec, journal, slims = _checkpointed_run(tmp_path, 5)
    full = journal.restore(slims[2])  # as if the run stopped after step 2's checkpoint
    assert full.next_step == 3 and not full.journal
    assert [s.sample_id for s in full.samples] == list(range(12))
    assert [s["step"] for s in full.steps] == [0, 1, 2]
    assert sum(s.resource == TRAINER for s in full.spans) == 3
    # the lines past that checkpoint are cut, so the resumed run appends after step 2
    assert len(journal.path.read_text().splitlines()) == 3
    resumed = Recorder.resumed(full)
    assert resumed.journal_delta(2, 9.0).samples == []  # restored samples are not repeated


def test_a_line_torn_by_a_crash_is_dropped(tmp_path):
    rec, journal, slims = _checkpointed_run(tmp_path, 3)
    with open(journal.path, "ab") as f:
        f.write(b'{"next_step": 4, "time_s": 4.0, "samp')  # the crash cut it here
    full = journal.restore(slims[-1])
    assert [s.sample_id for s in full.samples] == list(range(12))
    assert journal.path.read_text().endswith("\n")  # and it is cut off the file


def test_a_journaled_checkpoint_without_its_journal_is_an_error_naming_the_file(tmp_path):
    slim = DataPosition(3, 1.0, [], [], [], journal=True)
    missing = tmp_path / "checkpoints" / "history.jsonl"
    with pytest.raises(FileNotFoundError, match="history.jsonl"):
        HistoryJournal(missing).restore(slim)


def test_a_checkpoint_that_holds_its_whole_history_is_read_as_before(tmp_path):
    rec, _, _ = _checkpointed_run(tmp_path, 2)
    whole = DataPosition(2, 2.0, rec.trained_samples(), list(rec.spans), list(rec.steps))
    again = DataPosition.from_dict(whole.to_dict())
    assert HistoryJournal(tmp_path / "none.jsonl").restore(again) is again


def test_a_fresh_run_drops_a_journal_left_without_a_checkpoint(tmp_path):
    from runtime.history import resume_position

    ckpt = tmp_path / "checkpoints" / "last.pt"
    rec, journal, slims = _checkpointed_run(tmp_path, 2)
    assert resume_position(ckpt, slims[1]).next_step == 2  # with a checkpoint: restored
    assert resume_position(ckpt, None) is None  # none landed: a fresh run, no stale lines
    assert not journal.path.exists()


def test_a_server_busy_through_the_checkpoints_has_its_generation_journaled(tmp_path):
    """A ``pipeline`` server never goes idle: its busy span, open at each checkpoint, is
    cut there, so a run stopped later resumes with the generation before its checkpoint
    (it had none: timeline.png showed the server idle, generation_utilization too low)."""
    rec = Recorder()
    journal = HistoryJournal(journal_path(tmp_path / "checkpoints" / "last.pt"))
    slims = []
    rec.sent(0, 0.0)  # a request in flight from the start to the end
    for step in range(3):
        rec.sent(0, step + 0.1)
        rec.completion(completion(request(step), 0, step + 0.5))
        rec.returned(0, step + 0.5, step)
        rec.trained([step], step)
        delta = rec.journal_delta(step, step + 1.0)
        journal.append(delta)
        slims.append(DataPosition(delta.next_step, delta.time_s, [], [], [], journal=True))
    full = journal.restore(slims[1])  # stopped after step 1's checkpoint
    decode = [(s.start_s, s.end_s) for s in full.spans if s.kind == SpanKind.DECODE]
    assert decode == [(0.0, 1.0), (1.0, 2.0)]  # busy from 0 s to the checkpoint at 2 s
    rec.returned(0, 3.5, 2)  # the run goes on: the rest of the span, not all of it again
    assert [(s.start_s, s.end_s) for s in rec.spans] == [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0),
                                                          (3.0, 3.5)]  # fmt: skip
