"""Per-step tracking: the step reports, and what TensorBoard, W&B (offline) and MLflow (file store) wrote, read back."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
from helpers import small_spec

from experiments import run_cmd
from experiments.cli import main
from experiments.tracking import TensorBoardLogger, Tracker, tracker_for
from policies.records import SampleRecord, Span, SpanKind, StepStats
from policies.tracking import StepReport, StepReporter, StepUpdate
from sim.simulator import Simulation


def _scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value, read back from the event files with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not log_dir.exists():
        return {}
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def _sample(sid: int, step: int, start: float, end: float, version: int) -> SampleRecord:
    return SampleRecord(
        sample_id=sid, prompt_id=sid, group_id=sid, iteration=step, instance_id=0,
        prompt_tokens=5, output_tokens=10, predicted_output_tokens=None, dispatch_s=start,
        gen_start_s=start, gen_end_s=end, train_step=step, version_start=version,
        version_end=step, version_trained=step, reward=0.5 + sid / 10,
    )  # fmt: skip


def test_step_reports_count_each_window_once_and_open_busy_periods():
    rep = StepReporter()
    busy = Span("gen-0", SpanKind.DECODE, 0.0, 1.5)
    pause = Span("gen-0", SpanKind.WEIGHT_SYNC, 1.9, 2.0)
    train = Span("trainer", SpanKind.TRAIN, 1.0, 1.5, iteration=0)
    stats0 = StepStats(0, 1, 2, 30, 1.0, 2.0, loss=0.1, busy_s=0.5, clip_fraction=0.25)
    r0 = rep.report(StepUpdate(stats0, (_sample(0, 0, 0.0, 1.0, 0), _sample(1, 0, 0.2, 1.5, 0)),
                               (busy, train, pause)))  # fmt: skip
    assert (r0.window_s, r0.samples_per_s, r0.generation_s) == (2.0, 1.0, 1.5)
    assert r0.utilization == {"gen-0": 0.75, "trainer": 0.25}
    assert r0.pause_s == pytest.approx(0.1) and r0.reward == pytest.approx(0.55)
    assert r0.clip_fraction == 0.25 and r0.max_staleness == 0
    # step 1: nothing new recorded, but gen-0 has been busy since 3.0 (live: still open)
    stats1 = StepStats(1, 2, 1, 10, 3.0, 4.0, mean_reward=0.9)
    r1 = rep.report(StepUpdate(stats1, (_sample(2, 1, 2.0, 3.5, 0),), (),
                               (Span("gen-0", SpanKind.DECODE, 3.0, 4.0),)))  # fmt: skip
    assert r1.window_s == 2.0 and r1.utilization == {"gen-0": 0.5, "trainer": 0.0}
    assert r1.pause_s == 0.0 and r1.reward == 0.9 and r1.mean_staleness == 1
    scalars = r1.scalars()
    assert scalars["utilization/gen-0"] == 0.5 and "loss" not in scalars


def test_a_simulated_run_logs_every_step_to_tensorboard_as_it_happens(tmp_path):
    spec = small_spec(run__iterations=4, run__tracking="tensorboard")
    tracker = tracker_for(spec, tmp_path)
    seen_before: list[set[int]] = []

    def on_step(update: StepUpdate) -> None:
        # what a reader of the event file sees when the next step ends
        seen_before.append(set(_scalars(tmp_path / "tensorboard").get("time/run_s", {})))
        tracker(update)

    with tracker:
        result = Simulation(spec).run(on_step=on_step)
        tracker.finish(result.metrics)
    assert seen_before == [set(), {0}, {0, 1}, {0, 1, 2}]  # each step flushed at once
    tags = _scalars(tmp_path / "tensorboard")
    steps = result.steps
    assert set(tags["throughput/samples"]) == {0, 1, 2, 3}
    for s in steps:
        k = s["step"]
        assert tags["throughput/samples"][k] == s["num_samples"]
        assert tags["time/run_s"][k] == pytest.approx(s["end_s"])
        assert tags["time/train_s"][k] == pytest.approx(s["busy_s"])
        window = s["end_s"] - (steps[k - 1]["end_s"] if k else 0.0)
        assert tags["throughput/samples_per_s"][k] == pytest.approx(s["num_samples"] / window)
        for name in ("utilization/gen-0", "utilization/gen-1", "utilization/trainer"):
            assert 0.0 <= tags[name][k] <= 1.0 + 1e-6
    trained = {}
    for sample in result.samples:
        trained.setdefault(sample.train_step, []).append(sample.staleness)
    for k, stale in trained.items():
        assert tags["staleness/max"][k] == max(stale)
        assert tags["staleness/mean"][k] == pytest.approx(sum(stale) / len(stale))
    assert "summary/throughput_samples_per_s" in tags


def test_run_tracking_tensorboard_from_the_cli(tmp_path):
    out = tmp_path / "run"
    code = main(["run", "streamrl-7b", "--out", str(out), "--set", "run.iterations=2",
                 "--set", "algorithm.batch_size=64", "--set", "run.tracking=tensorboard"])  # fmt: skip
    assert code == 0
    assert set(_scalars(out / "tensorboard")["time/run_s"]) == {0, 1}
    log = (out / "run.log").read_text()
    assert "step 0: 64 samples" in log and "step 1: 64 samples" in log


def test_an_unknown_backend_is_a_spec_error_naming_the_key(tmp_path, capsys):
    assert (
        main(["run", "streamrl-7b", "--set", "run.tracking=neptune", "--out", str(tmp_path)]) == 2
    )
    assert "run.tracking" in capsys.readouterr().out


def test_wandb_logs_offline_into_the_run_directory(tmp_path, monkeypatch):
    """Real wandb, offline: the run's record file holds the resolved spec and one history
    record per step (wandb >= 0.2x reads it back only through its Go core, so the test
    counts the keys in the protobuf records)."""
    import wandb

    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    spec = small_spec(run__iterations=2, run__tracking="wandb", run__name="wb-check")
    with tracker_for(spec, tmp_path) as tracker:
        result = Simulation(spec).run(on_step=tracker)
        tracker.finish(result.metrics)
    # run.finish() returns before wandb's core process has flushed the record file (CI
    # once read only its 7-byte header); teardown waits for the core to write everything
    wandb.teardown()
    (record,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    data = record.read_bytes()
    assert data.count(b"throughput/samples_per_s") >= 2  # the steps 0 and 1
    assert b"stream-async" in data and b"wb-check" in data  # the spec as config, the name
    assert b"num_samples_trained" in data  # the summary


def test_mlflow_logs_to_a_file_store_under_the_run_directory(tmp_path, monkeypatch):
    """Real MLflow: read the run back from the file store with its own client."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    spec = small_spec(run__iterations=2, run__tracking="mlflow", run__name="ml-check")
    spec = spec.model_copy(update={"live": spec.live.model_copy(update={"token": "s3cret"})})
    with tracker_for(spec, tmp_path) as tracker:
        result = Simulation(spec).run(on_step=tracker)
        tracker.finish(result.metrics)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tandem").experiment_id])
    assert run.info.run_name == "ml-check" and run.info.status == "FINISHED"
    assert run.data.params["pipeline.mode"] == "stream-async"
    assert "s3cret" not in run.data.params.values()  # a secret is never tracked
    assert "live.token" in run.data.params
    history = client.get_metric_history(run.info.run_id, "throughput/samples_per_s")
    assert sorted(m.step for m in history) == [0, 1]
    trained = run.data.metrics["summary/num_samples_trained"]
    assert trained == result.metrics["num_samples_trained"]


def test_a_missing_optional_backend_is_named_before_the_run(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # find_spec raises / finds nothing
    with pytest.raises(ValueError, match="mlflow"):
        tracker_for(small_spec(run__tracking="mlflow"), tmp_path)


def test_tensorboard_logger_writes_nothing_until_a_step(tmp_path):
    TensorBoardLogger(tmp_path / "tb").close()
    Tracker([TensorBoardLogger(tmp_path / "tb")]).close()
    assert not (tmp_path / "tb").exists()


def test_a_resumed_live_recorder_reports_from_its_checkpoint_on():
    from runtime.recorder import DataPosition, Recorder

    old = Span("gen-0", SpanKind.DECODE, 30.0, 39.0)
    recorder = Recorder.resumed(DataPosition(5, 40.0, [], [old], []))
    record = _sample(7, 5, 41.0, 43.0, 4)
    recorder.samples[7] = record
    recorder.trained([7], 5)
    recorder.sent(0, 41.0)  # gen-0 busy from 41 s on, still at the step's end
    update = recorder.step_update(StepStats(5, 6, 1, 10, 43.0, 44.0), 44.0, 10)
    assert update.window_start_s == 40.0 and update.new_spans == ()  # the old span: reported
    assert update.open_spans == (Span("gen-0", SpanKind.DECODE, 41.0, 44.0),)
    assert [s.sample_id for s in update.samples] == [7] and update.num_steps == 10
    report = StepReporter().report(update)
    assert report.window_s == 4.0 and report.utilization["gen-0"] == 0.75
    later = recorder.step_update(StepStats(6, 7, 0, 0, 44.0, 45.0), 45.0, 10)
    assert later.window_start_s is None and later.samples == ()


@pytest.mark.parametrize(
    "raised, status",
    [(KeyboardInterrupt("stopped by SIGTERM"), "KILLED"), (RuntimeError("x"), "FAILED")],
)
def test_a_stopped_or_crashed_run_is_not_marked_finished_in_mlflow(
    tmp_path, monkeypatch, raised, status
):
    """Before: ``set_terminated`` with its default status, FINISHED, whatever happened."""
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    spec = small_spec(run__iterations=2, run__tracking="mlflow")

    def stop_after_a_step(update):
        tracker(update)
        raise raised

    with pytest.raises(type(raised)), tracker_for(spec, tmp_path) as tracker:
        Simulation(spec).run(on_step=stop_after_a_step)
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("tandem").experiment_id])
    assert run.info.status == status


def test_a_stopped_or_crashed_run_ends_its_wandb_run_with_a_non_zero_exit_code(tmp_path):
    from experiments.tracking import WandbLogger

    codes = []

    class FakeRun:
        def finish(self, exit_code=None):
            codes.append(exit_code)

    for raised in (None, RuntimeError("x"), KeyboardInterrupt()):
        logger = WandbLogger(tmp_path, small_spec())
        logger._run = FakeRun()  # as opened by its first step
        with contextlib.suppress(RuntimeError, KeyboardInterrupt), Tracker([logger]):
            if raised is not None:
                raise raised
    assert codes == [0, 1, 130]


def test_a_finished_live_run_run_again_writes_no_tracking(tmp_path, monkeypatch):
    """Re-running a finished live run into its --out shows its saved results
    (``experiments.live_out``); before, each time added a TensorBoard file of summary
    scalars at step 0 (and would open a new MLflow or W&B run)."""
    from experiments.specs import config_path
    from policies.spec import load_spec
    from runtime.run_dir import RunDir

    out = tmp_path / "run"
    sets = ["run.iterations=2", "algorithm.batch_size=64"]
    args = ["run", "streamrl-7b", "--out", str(out), "--set", sets[0], "--set", sets[1]]
    assert main(args) == 0
    # a live run's directory: its spec as given (not the split the simulator chose), a
    # checkpoint (a resume, not a new run)
    (out / "spec.yaml").write_text(load_spec(config_path("streamrl-7b"), sets).to_yaml())
    RunDir(out).checkpoint.parent.mkdir()
    RunDir(out).checkpoint.write_bytes(b"")
    monkeypatch.setattr(run_cmd, "execute", lambda *a, **k: pytest.fail("it ran again"))
    # a simulator's spec (groups of one): only the finished path is under test here
    monkeypatch.setattr("runtime.launcher.check_live_run", lambda *a, **k: None)
    assert main([*args, "--live", "--set", "run.tracking=tensorboard"]) == 0
    assert not (out / "tensorboard").exists()


def test_the_step_pause_is_steps_json_mean_over_instances_not_their_sum():
    """Before: the run log's "pause" summed the instances' pauses (8 instances: 8 times
    steps.json's ``breakdown.pause_s``, the mean) for the same step."""
    from policies.breakdown import step_breakdowns

    spec = small_spec(**{"run.iterations": 3, "cluster.generation.0.num_gpus": 4})
    rep = StepReporter()
    reports = []
    result = Simulation(spec).run(on_step=lambda u: reports.append(rep.report(u)))
    breakdowns = step_breakdowns(result.spans, result.steps)
    assert len({s.resource for s in result.spans if s.resource.startswith("gen-")}) == 4
    assert any(b.pause_s > 0 for b in breakdowns)
    assert [r.pause_s for r in reports] == pytest.approx([b.pause_s for b in breakdowns])


def _report(step: int, reward: float) -> StepReport:
    return StepReport(
        step=step, time_s=float(step), window_s=1.0, num_samples=1, num_tokens=1,
        samples_per_s=1.0, reward=reward, loss=None, kl=None, clip_fraction=None, ess=None,
        mean_lag=None, mean_staleness=None, max_staleness=None, generation_s=None,
        train_s=None, pause_s=0.0,
    )  # fmt: skip


def test_a_resumed_run_keeps_one_tensorboard_value_per_step(tmp_path):
    """A run stopped after logging steps 0..5 with its checkpoint at step 2 resumes at 3:
    the resumed part's file starts with a session start at step 3 (``purge_step``), so
    TensorBoard drops the stopped part's 3..5 and shows the resumed values."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    log_dir = tmp_path / "tensorboard"
    for steps, offset in ((range(6), 0.0), (range(3, 8), 100.0)):  # two parts, one dir
        logger = TensorBoardLogger(log_dir)
        for step in steps:
            logger.log_step(_report(step, offset + step))
        logger.close()
    first, resumed = sorted(log_dir.iterdir())
    events = [e for e in EventFileLoader(str(resumed)).Load() if not e.HasField("file_version")]
    assert events[0].HasField("session_log") and events[0].session_log.status == 1  # START
    assert events[0].step == 3
    expected = {s: float(s) for s in range(3)} | {s: 100.0 + s for s in range(3, 8)}
    assert _scalars(log_dir)["reward"] == expected
