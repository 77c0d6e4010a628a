"""Resuming a live run checks the spec against the run's own (issue #16, item 5).

A run directory with a checkpoint resumes only with a spec that trains the same thing:
another learning rate, batch size or number of iterations is refused naming the keys
(exit 2, before anything starts), unless ``--force-new-spec``; ``spec.yaml`` always stays
the original. Operational keys (where servers run, tokens, threads) may change.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.cli import main
from policies.spec import SpecError, load_spec
from runtime.run_dir import RunDir, training_changes

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"
DEAD_SERVER = "live.server_urls=[http://127.0.0.1:9]"  # nothing listens: a run would fail


def _finished_run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    RunDir(out).prepare(load_spec(CONFIG, [DEAD_SERVER]))
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "last.pt").write_bytes(b"a checkpoint")
    return out


def test_a_fresh_run_writes_its_spec_and_a_resume_with_the_same_spec_goes_on(tmp_path):
    out = _finished_run(tmp_path)
    original = (out / "spec.yaml").read_text()
    assert load_spec(out / "spec.yaml") == load_spec(CONFIG, [DEAD_SERVER])
    RunDir(out).prepare(load_spec(out / "spec.yaml"))  # the resume command's spec
    changed_host = load_spec(CONFIG, ["live.server_urls=[http://127.0.0.1:10]", "live.token=x"])
    RunDir(out).prepare(changed_host)  # operational keys may change
    assert (out / "spec.yaml").read_text() == original


def test_a_resume_that_changes_training_is_refused_naming_the_keys(tmp_path, capsys):
    out = _finished_run(tmp_path)
    original = (out / "spec.yaml").read_text()
    code = main(
        ["run", str(CONFIG), "--live", "--out", str(out), "--set", DEAD_SERVER,
         "--set", "algorithm.learning_rate=0.001", "--set", "algorithm.batch_size=16"]
    )  # fmt: skip
    printed = " ".join(capsys.readouterr().out.split())
    assert code == 2
    assert "algorithm.batch_size (32 → 16)" in printed
    assert "algorithm.learning_rate (0.0001 → 0.001)" in printed
    assert "--force-new-spec" in printed and f"tandem run {out}/spec.yaml" in printed
    assert (out / "spec.yaml").read_text() == original  # the original spec is kept


def test_more_iterations_is_a_change_too():
    base = load_spec(CONFIG)
    more = load_spec(CONFIG, ["run.iterations=12"])
    assert training_changes(base, more) == ["run.iterations (6 → 12)"]


def test_force_new_spec_goes_on_and_keeps_both_specs(tmp_path):
    out = _finished_run(tmp_path)
    original = (out / "spec.yaml").read_text()
    new = load_spec(CONFIG, [DEAD_SERVER, "run.iterations=12"])
    with pytest.raises(SpecError):
        RunDir(out).prepare(new)
    RunDir(out).prepare(new, force_new_spec=True)
    assert (out / "spec.yaml").read_text() == original
    assert load_spec(out / "spec.resumed-1.yaml") == new


def test_a_checkpoint_without_its_spec_is_not_resumed_blindly(tmp_path):
    out = _finished_run(tmp_path)
    (out / "spec.yaml").unlink()
    with pytest.raises(SpecError, match="no spec.yaml"):
        RunDir(out).prepare(load_spec(CONFIG))


def test_after_a_forced_change_a_resume_is_checked_against_the_newest_spec(tmp_path):
    """Before: every resume was checked against the original spec.yaml, so the suggested
    resume command (naming spec.yaml) ran the pre-change spec and found the run finished."""
    out = _finished_run(tmp_path)
    longer = load_spec(CONFIG, [DEAD_SERVER, "run.iterations=30"])
    RunDir(out).prepare(longer, force_new_spec=True)
    RunDir(out).prepare(longer)  # the spec it last ran: no --force-new-spec again
    assert not (out / "spec.resumed-2.yaml").exists()
    assert (
        RunDir(out).resume_command() == f"tandem run {out}/spec.resumed-1.yaml --live --out {out}"
    )
    with pytest.raises(SpecError, match=r"run.iterations \(30 → 6\).*spec.resumed-1.yaml"):
        RunDir(out).prepare(load_spec(out / "spec.yaml"))


def test_results_older_than_the_last_checkpoint_are_not_a_finished_run(tmp_path):
    """Seen: a run extended with --force-new-spec and killed at step 9 was taken, on the
    next resume, for finished by its first part's 4 saved steps."""
    out = _finished_run(tmp_path)
    spec = load_spec(CONFIG, [DEAD_SERVER, "run.iterations=4"])
    (out / "steps.json").write_text("[" + ", ".join(["{}"] * 4) + "]")
    (out / "metrics.json").write_text("{}")
    journal = out / "checkpoints" / "history.jsonl"
    journal.write_text("".join(f'{{"next_step":{n},"samples":[]}}\n' for n in (2, 4)))
    assert RunDir(out).finished(spec)
    with journal.open("a") as f:
        f.write('{"next_step":10,"samples":[]}\n{"next_step":12,"sam')  # the last line torn
    assert not RunDir(out).finished(spec)  # checkpointed through step 9, saved 4
    journal.write_text('{"next_step":4,"samples":[]}\n{"next_step":6,"sam')
    assert RunDir(out).finished(spec)  # a torn line is no checkpoint


def test_a_resumed_run_keeps_what_its_earlier_part_saved_of_its_steps_and_cpu(tmp_path):
    """Seen: extending a finished 4-step run to 8 rewrote steps 0-3 from the checkpoint
    (their optimizer, checkpoint and report timings gone, the breakdown recomputed) and
    kept only the new part's CPU timeline."""
    import json

    import pandas as pd

    out = _finished_run(tmp_path)
    first = [{"step": i, "end_s": i + 1.0, "optimizer_s": 0.01 * i, "breakdown": {"x": i}}
             for i in range(4)]  # fmt: skip
    (out / "steps.json").write_text(json.dumps(first))
    rows = [{"start_s": t, "end_s": t + 1.0, "trainer": 0.5} for t in (0.0, 1.0, 2.0, 3.0)]
    pd.DataFrame(rows).to_csv(out / "cpu_timeline.csv", index=False)
    earlier = RunDir(out).earlier_part(next_step=4, time_s=4.0)
    assert earlier.steps == first and earlier.cpu_rows == rows
    rebuilt = [{"step": i, "end_s": i + 0.9, "breakdown": {"y": i}} for i in range(8)]
    (out / "steps.json").write_text(json.dumps(rebuilt))  # what the resumed part saves
    RunDir(out).keep_earlier(earlier)
    assert json.loads((out / "steps.json").read_text()) == first + rebuilt[4:]
    assert RunDir(out).earlier_part(next_step=2, time_s=2.0).cpu_rows == rows[:2]


def test_keys_that_only_say_how_a_run_is_recorded_or_run_may_change_on_resume():
    """Before: ``--set run.tracking=mlflow`` on a resume was refused as a training change."""
    base = load_spec(CONFIG)
    recorded = load_spec(
        CONFIG,
        ["run.tracking=mlflow", "live.keep_checkpoints=0", "live.cpu_sample_s=0",
         "live.lend_idle_cores=false", "live.weight_backend=gloo"],
    )  # fmt: skip
    assert training_changes(base, recorded) == []


def test_a_part_stopped_before_its_save_leaves_its_cpu_rows_for_the_resume(tmp_path, monkeypatch):
    """Seen: SIGTERM at step 7, then resume: cpu_timeline.csv had no rows before step 7.
    A part saved its rows only at its end; now they reach the file as they are measured
    (tests/test_cpu_rows_file.py: a SIGKILLed part's too)."""
    import asyncio

    import pandas as pd

    from runtime import live_run

    out = _finished_run(tmp_path)
    first = [{"start_s": t, "end_s": t + 1.0, "trainer": 0.5} for t in (0.0, 1.0)]
    pd.DataFrame(first).to_csv(out / "cpu_timeline.csv", index=False)  # a saved first part
    mine = [{"start_s": t, "end_s": t + 1.0, "trainer": 0.25} for t in (2.0, 3.0, 4.0)]

    class StoppedActor:  # loads the weights, then the run is stopped (SIGTERM unwinds it)
        def now(self) -> float:
            return 5.0

        async def push_now(self, version):
            pass

        async def run(self):
            raise KeyboardInterrupt("stopped by SIGTERM")

    class Timeline:  # measures this part's rows, each handed on as it is measured
        def __init__(self, on_row) -> None:
            self.on_row = on_row

        def stop(self):
            for row in mine:
                self.on_row(row)
            return mine

    spec = load_spec(CONFIG, [DEAD_SERVER])
    cpu_file = RunDir(out).cpu_rows_file(2, 2.0)  # this part began at step 2, 2 s
    monkeypatch.setattr(live_run, "_cpu_timeline", lambda *args: Timeline(args[-1]))
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(live_run._run_clocked(spec, StoppedActor(), None, None, 2, True, cpu_file))
    assert RunDir(out).earlier_part(next_step=4, time_s=4.0).cpu_rows == first + mine[:2]
