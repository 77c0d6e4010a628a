"""``run_live`` end to end on the shared server: result files, versions, kill and resume."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from helpers import ALL_MODES as REGISTERED_MODES
from helpers import STALENESS_BOUND, TANDEM
from proc_view import alive, descendants, wait_until

from policies.results import CPU_METRICS, LIVE_METRICS, METRIC_NAMES
from policies.spec import load_spec
from runtime.checkpoints import kept_steps
from runtime.errors import LiveRunError
from runtime.history import journal_steps
from runtime.launcher import run_live
from runtime.tasks import VOCAB, completion_text, task_set

pytestmark = pytest.mark.live

CONFIG = Path(__file__).resolve().parents[2] / "experiments" / "configs" / "live-tiny.yaml"
REPO = CONFIG.parents[2]


def _overrides(server: str, token: str, mode: str, iterations: int) -> list[str]:
    return [
        f"pipeline.mode={mode}", f"run.iterations={iterations}", "algorithm.batch_size=16",
        f"live.server_urls=[{server}]", f"live.token={token}",
    ]  # fmt: skip


# every registered mode but ``conventional`` (G = 1 runs as disagg-sync); their fixed bounds
ALL_MODES = [m for m in REGISTERED_MODES if m != "conventional"]
BOUND = STALENESS_BOUND


@pytest.mark.parametrize("mode", ALL_MODES)
def test_run_live_writes_results_with_versions(server, token, tmp_path, mode):
    spec = load_spec(CONFIG, _overrides(server, token, mode, 3))
    result = run_live(spec, tmp_path)
    for name in ("spec.yaml", "metrics.json", "samples.parquet", "events.parquet"):
        assert (tmp_path / name).exists(), name
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    assert len(samples) == 3 * 16 and samples["sample_id"].is_unique
    assert samples["train_step"].notna().all()
    assert (samples["version_end"] >= samples["version_start"]).all()
    stale = samples["version_trained"] - samples["version_start"]
    bound = BOUND.get(mode, spec.pipeline.max_lag)
    assert stale.between(0, bound).all()
    assert samples["reward"].between(0, 1).all()
    # what the reward scored, token by token: every id decodes, the reward recomputes
    tasks = task_set(spec)
    for row in samples.itertuples():
        ids = list(row.completion_token_ids)
        assert len(ids) == row.output_tokens and max(ids) < len(VOCAB)
        assert row.completion_text == completion_text(ids)
        assert tasks.reward(row.prompt_id, row.completion_text) == row.reward
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["num_samples_trained"] == 48 and result.metrics["live_wall_s"] > 0
    names = {*METRIC_NAMES, *LIVE_METRICS}  # the one list of metric names
    assert names <= set(metrics) <= names | set(CPU_METRICS)
    # CPU over the clock by role: this process and the trainer it started; the attached
    # server is not the run's own (its CPU is not the run's engine or frontend)
    assert metrics["cpu_ms_per_sample_actor"] > 0 and metrics["cpu_ms_per_sample_trainer"] > 0
    assert "cpu_ms_per_sample_engine" not in metrics
    roles = sum(v for k, v in metrics.items() if k.startswith("cpu_ms_per_sample_"))
    assert metrics["cpu_ms_per_sample"] == pytest.approx(roles)
    # the same CPU interval by interval (runtime.cpu_timeline): it adds up to the totals
    cpu = pd.read_csv(tmp_path / "cpu_timeline.csv")
    assert {"actor", "trainer", "total"} <= set(cpu) and "engine" not in cpu
    cpu_s = (cpu["total"] * (cpu["end_s"] - cpu["start_s"])).sum()
    wall_s = metrics["live_wall_s"]
    # the timeline spans its first to its last reading, each within 0.5 s of the clock's
    # ends (below); the totals also count the CPU outside it, at most every core's (CI:
    # 0.710 s of CPU in the timeline against 0.790 s in all, 0.001 s outside a bound that
    # left the head out). Each process's CPU is read in 10 ms ticks, at both ends of the
    # timeline: 0.1 s of slack at least (a 0.5 s run on CI: 0.610 s against 0.690 s, 0.005
    # s outside a slack of 0.069 s)
    total_s, head_s = metrics["cpu_cores_used"] * wall_s, cpu["start_s"].iloc[0]
    outside_s = os.cpu_count() * (head_s + max(0.0, wall_s - cpu["end_s"].iloc[-1]))
    tolerance_s = max(0.1 * total_s, 0.1)
    assert total_s - tolerance_s - outside_s <= cpu_s <= total_s + tolerance_s
    assert cpu["start_s"].iloc[0] < 0.5 and cpu["end_s"].iloc[-1] == pytest.approx(wall_s, abs=0.5)
    # the servers were warmed before the clock; startup and the first step are reported
    assert metrics["warm_up_s"] > 0 and metrics["startup_s"] > metrics["warm_up_s"]
    assert 0 < metrics["time_to_first_step_s"] <= metrics["live_wall_s"]
    steps = json.loads((tmp_path / "steps.json").read_text())
    for step in steps:  # each step's time split without overlap (policies.breakdown)
        parts = step["breakdown"]
        split = sum(parts[k] for k in ("train_s", "optimizer_s", "checkpoint_s",
                                       "bookkeeping_s", "push_s", "switch_s", "wait_s"))  # fmt: skip
        assert split == pytest.approx(parts["window_s"], abs=1e-6)
        assert parts["optimizer_s"] > 0 and parts["checkpoint_s"] > 0  # one every step
    kinds = set(pd.read_parquet(tmp_path / "events.parquet")["kind"])
    assert {"decode", "train", "weight_sync"} <= kinds
    if mode == "colocated-sync":
        assert "context_switch" in kinds
    saved = (tmp_path / "spec.yaml").read_text()  # the resolved spec, without its secret
    assert token not in saved and load_spec(tmp_path / "spec.yaml").live.token is None


def test_a_run_attaches_with_the_token_of_tandem_token(server, token, tmp_path, monkeypatch):
    """``TANDEM_TOKEN`` instead of ``live.token``: the token on no command line or file."""
    overrides = [o for o in _overrides(server, token, "disagg-sync", 1) if "token" not in o]
    monkeypatch.setenv("TANDEM_TOKEN", token)
    run_live(load_spec(CONFIG, overrides), tmp_path)
    assert json.loads((tmp_path / "metrics.json").read_text())["num_samples_trained"] == 16
    monkeypatch.setenv("TANDEM_TOKEN", "not-" + token)
    with pytest.raises(LiveRunError, match=r"refused the run's token \(403"):
        run_live(load_spec(CONFIG, overrides), tmp_path / "wrong")


def test_stream_async_with_overlap_starts_a_batch_before_the_last_one_ends(server, token, tmp_path):
    """``pipeline.overlap_waves``: batch w+1 is dispatched before batch w's last answer,
    weights load in flight, and every step still trains exactly its batch within lag 1."""
    overrides = _overrides(server, token, "stream-async", 4) + ["pipeline.overlap_waves=true"]
    result = run_live(load_spec(CONFIG, overrides), tmp_path)
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    assert sorted(samples["sample_id"]) == list(range(4 * 16))
    assert (samples["iteration"] == samples["train_step"]).all()
    stale = samples["version_trained"] - samples["version_start"]
    assert stale.between(0, 1).all() and stale.max() == 1
    by_batch = samples.groupby("iteration")
    first_dispatch, last_end = by_batch["dispatch_s"].min(), by_batch["gen_end_s"].max()
    assert (first_dispatch.iloc[1:].to_numpy() < last_end.iloc[:-1].to_numpy()).any()
    assert [s["step"] for s in result.steps] == list(range(4))


@pytest.mark.parametrize(
    ("mode", "sig"),
    [("stream-sync", signal.SIGKILL), ("pipeline", signal.SIGKILL), ("pipeline", signal.SIGTERM)],
    ids=["stream-sync-killed", "pipeline-killed", "pipeline-terminated"],
)
def test_kill_mid_run_then_resume_loses_and_duplicates_nothing(server, token, tmp_path, mode, sig):
    steps = 20  # the kill lands at the second checkpoint, long before the end
    args = _overrides(server, token, mode, steps)
    sets = [f"--set={a}" for a in args]
    cmd = [*TANDEM, "run", str(CONFIG), "--live",
           "--out", str(tmp_path), *sets]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    ckpt = tmp_path / "checkpoints" / "last.pt"
    try:
        deadline = time.monotonic() + 300
        while not ckpt.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ckpt.exists() and proc.poll() is None, "the run never checkpointed"
        first = _identity(ckpt)
        while _identity(ckpt) == first and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)  # until a later step's checkpoint replaced it
        if sig == signal.SIGTERM:  # as a scheduler preempts a job: the command alone
            children = descendants(proc.pid)  # the trainer and its helpers
            os.kill(proc.pid, sig)
            assert proc.wait(timeout=60) == 128 + sig  # unwound, as Ctrl-C does
            assert children and wait_until(lambda: not any(alive(p) for p in children), 30)
            assert "stopped by SIGTERM" in (tmp_path / "run.log").read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "samples.parquet").exists()  # it really died mid-run
    spec = load_spec(CONFIG, args)
    result = run_live(spec, tmp_path)
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    assert sorted(samples["sample_id"]) == list(range(steps * 16))  # none lost, none twice
    assert samples["train_step"].value_counts().sort_index().tolist() == [16] * steps
    if mode != "pipeline":  # pipeline may train a group of iteration i in another step
        assert (samples["iteration"] == samples["train_step"]).all()
    assert (samples["iteration"] == samples["sample_id"] // 16).all()
    assert [s["step"] for s in result.steps] == list(range(steps))


def test_sigterm_checkpoints_the_last_logged_step_and_resume_trains_each_step_once(
    server, token, tmp_path
):
    """Checkpoints at most hourly: SIGTERM (a scheduler's preemption) checkpoints the last
    step the run logged before it exits 143 and prints the command that resumes it, and
    the resumed part starts at the next step (before: the steps since the last checkpoint,
    here all of them, were lost and trained again)."""
    steps = 20
    args = [*_overrides(server, token, "pipeline", steps), "live.checkpoint_min_interval_s=3600"]
    cmd = [*TANDEM, "run", str(CONFIG), "--live", "--out", str(tmp_path),
           *(f"--set={a}" for a in args)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: len(_logged_steps(tmp_path)) >= 3 or proc.poll() is not None, 300)
        assert proc.poll() is None and not (tmp_path / "checkpoints" / "last.pt").exists()
        proc.send_signal(signal.SIGTERM)  # the command alone
        printed, _ = proc.communicate(timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 143
    resume = f"resume with: tandem run {tmp_path}/spec.yaml --live --out {tmp_path}"
    assert f"terminated; {resume}" in " ".join(printed.split())
    logged = _logged_steps(tmp_path)
    checkpointed = journal_steps(tmp_path / "checkpoints" / "history.jsonl")
    assert logged == list(range(len(logged))) and checkpointed == len(logged)
    resumed: list[int] = []
    run_live(load_spec(CONFIG, args), tmp_path, on_step=lambda u: resumed.append(u.stats.step))
    assert resumed == list(range(len(logged), steps))  # every step trained once
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    assert sorted(samples["sample_id"]) == list(range(steps * 16))  # none lost, none twice
    assert samples["train_step"].value_counts().sort_index().tolist() == [16] * steps


def test_sigterm_to_the_whole_process_group_still_checkpoints_the_last_logged_step(
    server, token, tmp_path
):
    """SIGTERM to every process of the run (``kill -TERM -PGID``: Slurm, a container's init,
    many schedulers): the trainer leaves it to the command, which checkpoints the last logged
    step, then stops it; nothing the run started outlives it. Before: the trainer died of
    the signal, the stop's checkpoint failed and every step trained since the last was lost."""
    args = [*_overrides(server, token, "pipeline", 20), "live.checkpoint_min_interval_s=3600"]
    cmd = [*TANDEM, "run", str(CONFIG), "--live", "--out", str(tmp_path),
           *(f"--set={a}" for a in args)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_until(lambda: len(_logged_steps(tmp_path)) >= 3 or proc.poll() is not None, 300)
        assert proc.poll() is None and not (tmp_path / "checkpoints" / "last.pt").exists()
        children = descendants(proc.pid)  # the trainer and its helpers
        os.killpg(proc.pid, signal.SIGTERM)  # the command and every child in its group
        assert proc.wait(timeout=120) == 143
        assert children and wait_until(lambda: not any(alive(p) for p in children), 30)
    finally:
        with contextlib.suppress(ProcessLookupError):  # nothing of the group is left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    logged = _logged_steps(tmp_path)
    checkpointed = journal_steps(tmp_path / "checkpoints" / "history.jsonl")
    assert logged == list(range(len(logged))) and checkpointed == len(logged)
    assert kept_steps(tmp_path / "checkpoints")[-1] == logged[-1]  # the trainer's state too
    assert "the stop's checkpoint" not in (tmp_path / "run.log").read_text()  # no failure


def _logged_steps(run_dir: Path) -> list[int]:
    """The steps whose line the run's log holds (``step N: ...``), in order."""
    path = run_dir / "run.log"
    text = path.read_text() if path.exists() else ""
    return [int(m) for m in re.findall(r"experiments.tracking: step (\d+): ", text)]


def test_a_checkpoint_interval_longer_than_the_run_checkpoints_its_last_step_only(
    server, token, tmp_path
):
    overrides = [*_overrides(server, token, "stream-async", 4), "live.keep_checkpoints=10"]
    spec = load_spec(CONFIG, [*overrides, "live.checkpoint_min_interval_s=3600"])
    run_live(spec, tmp_path)
    # with 10 kept, every step that checkpointed is there: only the last, for export
    assert kept_steps(tmp_path / "checkpoints") == [3]


def _identity(path: Path) -> tuple[int, int] | None:
    """Which file ``path`` is now (a checkpoint is replaced whole, by rename)."""
    try:
        st = path.stat()
    except FileNotFoundError:  # between the old one's removal and the new one's rename
        return None
    return (st.st_ino, st.st_mtime_ns)


def test_a_live_ranker_learns_from_the_runs_own_completions(server, token, tmp_path):
    from ranker.online import RankerPredictor

    overrides = _overrides(server, token, "stream-async", 8)
    overrides += ["workload.num_prompts=8", "policies.length_predictor=ranker"]
    spec = load_spec(CONFIG, overrides)
    ranker = RankerPredictor()
    run_live(spec, tmp_path, ranker)
    samples = pd.read_parquet(tmp_path / "samples.parquet")
    predicted = samples.groupby("iteration")["predicted_output_tokens"].apply(
        lambda p: p.notna().all()
    )
    assert not predicted[0]  # nothing to learn from before the first completions
    assert predicted[7]  # later iterations are dispatched on the ranker's predictions
    assert ranker.num_refreshes >= 1
    assert len(ranker.observations) >= 8 * 16 - 32  # every finished sample, in batches of 32


def test_the_ranker_orders_a_live_trace_of_the_tasks_on_a_later_epoch(server, token, tmp_path):
    """Issue #4's live check: three epochs of live-tiny (256 prompts, 96 steps of 32),
    ranker fitted on the first two, scored on the third with the history as online.

    How predictable the longest 10 % and 5 % are depends on the embedded model's build,
    which differs bit by bit across CPUs (docs/ranker.md): measured 0.912-0.941 / 0.824-
    0.902 at 10 % / 5 % on the builds of one machine, 0.755 / 0.667 on another (AMD EPYC,
    AVX2), where the prompts' own history ranks them no better (median predictor
    0.794 / 0.686). So the ranker must reach the absolute target at 20 %, beat the
    prompt-length baseline everywhere, and get what the prompts' history reveals at
    10 % and 5 % (within 0.05: five samples at 10 %, two at 5 %).
    """
    from experiments.predictors import load_trace
    from ranker.evaluate import later_epoch_report

    overrides = [
        "pipeline.mode=stream-async", "run.iterations=96",
        f"live.server_urls=[{server}]", f"live.token={token}",
    ]  # fmt: skip
    run_live(load_spec(CONFIG, overrides), tmp_path)
    trace = load_trace(tmp_path / "samples.parquet")
    assert trace["prompt"].notna().all() and trace["iteration"].max() == 95
    report = later_epoch_report(trace, "hgb", cut_iteration=64)
    ranker, baseline, history = report["ranker"], report["baseline"], report["history"]
    assert ranker.num_samples == 32 * 32
    assert ranker.recall_20 >= 0.90
    assert ranker.recall_10 >= min(0.85, history.recall_10 - 0.05)
    assert ranker.recall_5 >= min(0.80, history.recall_5 - 0.05)
    for metric in ("recall_20", "recall_10", "recall_5", "spearman", "kendall"):
        assert getattr(ranker, metric) > getattr(baseline, metric), metric


def test_a_blown_up_gradient_stops_the_run_at_its_step_and_keeps_the_last_checkpoint(
    server, token, tmp_path
):
    """A learning rate of 1e4: step 0's update makes step 1's gradient NaN. Before, that step
    was applied, its push refused by the server as non-finite, and the run hung."""
    overrides = _overrides(server, token, "disagg-sync", 4) + ["algorithm.learning_rate=1e4"]
    with pytest.raises(LiveRunError, match=r"trainer step 1: the gradient norm is (nan|inf)"):
        run_live(load_spec(CONFIG, overrides), tmp_path)  # before: never returned
    assert kept_steps(tmp_path / "checkpoints") == [0]  # step 0's, whole
    assert (tmp_path / "checkpoints" / "last.pt").exists()


def test_a_finished_run_run_again_returns_its_results_without_starting_anything(
    server, token, tmp_path, monkeypatch
):
    """Before: the second command started the servers and the trainer (~25 s) to find no
    step left, and wrote the results again."""
    import runtime.launcher

    spec = load_spec(CONFIG, _overrides(server, token, "disagg-sync", 2))
    first = run_live(spec, tmp_path)
    saved = {
        p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name != "run.log"
    }

    def started(*args, **kwargs):
        raise AssertionError("processes started for a finished run")

    monkeypatch.setattr(runtime.launcher, "_run_processes", started)
    again = run_live(spec, tmp_path)
    assert again.metrics == first.metrics
    assert {
        p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file() and p.name != "run.log"
    } == saved
    assert "holds this run, finished" in (tmp_path / "run.log").read_text()
    longer = load_spec(CONFIG, _overrides(server, token, "disagg-sync", 3))
    with pytest.raises(AssertionError, match="processes started"):  # one step left: it runs
        run_live(longer, tmp_path, force_new_spec=True)


def test_a_second_run_is_refused_a_server_another_run_holds_and_gets_it_when_that_ends(
    server, token, tmp_path
):
    """runtime.lease: before, both runs joined the server's weight group and pushed; each
    trained partly on samples of the other's weights (mean staleness -2.4) and exited 0."""
    first = load_spec(CONFIG, _overrides(server, token, "disagg-sync", 3))
    second = load_spec(CONFIG, _overrides(server, token, "disagg-sync", 1))
    refusals: list[str] = []

    async def meanwhile(step: int) -> None:
        if step == 1:  # the first run holds the server: the second is refused at once
            with pytest.raises(LiveRunError) as refused:
                await asyncio.to_thread(run_live, second, tmp_path / "second")
            refusals.append(str(refused.value))

    run_live(first, tmp_path / "first", after_step=meanwhile)
    assert len(refusals) == 1 and f"live.server_urls[0] {server} serves another run" in refusals[0]
    assert not (tmp_path / "second" / "metrics.json").exists()
    run_live(second, tmp_path / "second")  # released at the first run's end: the server is free
    assert (
        json.loads((tmp_path / "second" / "metrics.json").read_text())["num_samples_trained"] == 16
    )
