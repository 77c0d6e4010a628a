"""A graceful stop (SIGTERM, Ctrl-C) checkpoints the last trained step, then unwinds
(runtime.graceful_stop): the actor with fake servers and trainer, and the signal path."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from server_fakes import BATCH, CONFIG, FakeClient, FakeTrainer, FakeWorld

from policies.spec import load_spec
from runtime.graceful_stop import RunStopped, StopRequests
from runtime.history import HistoryJournal, journal_path
from runtime.live_run import make_actor
from runtime.recorder import DataPosition, Recorder

STOP_AFTER = 3  # steps: the stop comes while the trainer trains the fourth


class StoppingTrainer(FakeTrainer):
    """Asks for a stop in its first train call after ``STOP_AFTER`` steps; keeps the order
    of its calls and the sample ids each step trained."""

    def __init__(self, world: FakeWorld) -> None:
        super().__init__(world)
        self.calls: list[str] = []
        self.steps: list[list[int]] = [[]]
        self.positions: list[DataPosition] = []
        self.request_stop = lambda: None

    async def train(self, items, now_s):
        if len(self.steps) == STOP_AFTER + 1 and "stop" not in self.calls:
            self.calls.append("stop")
            self.request_stop()
        await asyncio.sleep(0.01)  # the stop is asked while this job runs
        self.calls.append("train")
        self.steps[-1] += [it.sample_id for it in items]
        return await super().train(items, now_s)

    async def step(self, step, now_s):
        self.calls.append(f"step {step}")
        self.steps.append([])
        return await super().step(step, now_s)

    async def checkpoint(self, path, position):
        self.calls.append(f"checkpoint {position.next_step - 1}")
        self.positions.append(position)


@pytest.mark.parametrize("mode", ["stream-async", "pipeline", "disagg-sync"])
def test_a_stop_checkpoints_the_last_completed_step_the_cadence_skipped(mode, tmp_path):
    spec = load_spec(CONFIG, [
        f"pipeline.mode={mode}", "run.iterations=8", f"algorithm.batch_size={BATCH}",
        "live.num_servers=1", "live.checkpoint_min_interval_s=3600",
    ])  # fmt: skip
    ckpt = tmp_path / "checkpoints" / "last.pt"
    trainer = _run_until_stopped(spec, ckpt)
    last = STOP_AFTER - 1
    # the train job in progress finished, no other started, then the checkpoint of the
    # last completed step (the cadence skipped every one before the run's last)
    stop = trainer.calls.index("stop")
    assert trainer.calls[stop + 1 :] == ["train", f"checkpoint {last}"]
    assert f"step {last}" in trainer.calls and f"step {last + 1}" not in trainer.calls
    (slim,) = trainer.positions
    assert slim.journal and slim.next_step == STOP_AFTER
    position = HistoryJournal(journal_path(ckpt)).restore(slim)
    trained = [sid for step in trainer.steps[:STOP_AFTER] for sid in step]
    assert sorted(s.sample_id for s in position.samples) == sorted(trained)  # steps 0..2 only
    assert trainer.steps[STOP_AFTER]  # the next step's samples, trained in part: not kept
    assert not {s.sample_id for s in position.samples} & set(trainer.steps[STOP_AFTER])
    assert [st["step"] for st in position.steps] == list(range(STOP_AFTER))


def test_a_stop_with_the_last_step_checkpointed_writes_nothing(tmp_path):
    spec = load_spec(CONFIG, [
        "pipeline.mode=stream-async", "run.iterations=8", f"algorithm.batch_size={BATCH}",
        "live.num_servers=1",
    ])  # fmt: skip
    trainer = _run_until_stopped(spec, tmp_path / "last.pt")
    checkpoints = [c for c in trainer.calls if c.startswith("checkpoint")]
    assert checkpoints == [f"checkpoint {s}" for s in range(STOP_AFTER)]  # every step's, once


def _run_until_stopped(spec, ckpt: Path, kind=StoppingTrainer, caplog=None) -> StoppingTrainer:
    """Run the actor on one fake server until the trainer asks it to stop mid-step."""
    world = FakeWorld(1)
    trainer = kind(world)
    actor = make_actor(spec, {0: FakeClient(0, world)}, trainer, Recorder(), set(), 0, str(ckpt),
                       None, None, "gloo")  # fmt: skip
    trainer.request_stop = actor.request_stop

    async def run() -> None:
        await actor.push_now(0)
        await asyncio.wait_for(actor.run(), 30)

    if caplog is not None:
        caplog.set_level("WARNING", logger="runtime.step_checkpoints")
    with pytest.raises(RunStopped):
        asyncio.run(run())
    return trainer


def _unwinding(seen: list[int]):
    def handler(signum, frame):  # as experiments.stop_signal.SigtermUnwinds
        seen.append(signum)
        raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    return handler


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_signal_asks_the_listener_then_reaches_the_handler_once_the_run_stopped(sig):
    seen: list[int] = []
    asked: list[str] = []
    previous = signal.signal(sig, _unwinding(seen))  # SIGINT: as default_int_handler
    try:

        async def run(stops: StopRequests) -> None:
            with stops.listening(lambda deadline: asked.append("stop")):
                os.kill(os.getpid(), sig)
                await asyncio.sleep(0.05)  # the handler did not raise: the loop goes on
                assert asked == ["stop"] and seen == []
                raise RunStopped("checkpointed")

        with pytest.raises(KeyboardInterrupt, match=sig.name), StopRequests(grace_s=60.0) as stops:
            asyncio.run(run(stops))
        assert seen == [sig]  # told once the stop was done (SIGTERM: exit 143)
        assert signal.getsignal(sig) != stops._handle  # restored
    finally:
        signal.signal(sig, previous)


def test_a_second_signal_or_none_listening_unwinds_at_once():
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, _unwinding(seen))
    try:
        with pytest.raises(KeyboardInterrupt), StopRequests(grace_s=60.0):
            os.kill(os.getpid(), signal.SIGTERM)  # nothing listens yet (start-up)
            time.sleep(0.5)
        assert seen == [signal.SIGTERM]

        async def run(stops: StopRequests) -> None:
            with stops.listening(lambda deadline: None):
                os.kill(os.getpid(), signal.SIGTERM)
                await asyncio.sleep(0.05)
                os.kill(os.getpid(), signal.SIGTERM)  # again: at once
                await asyncio.sleep(0.5)

        with pytest.raises(KeyboardInterrupt), StopRequests(grace_s=60.0) as stops:
            asyncio.run(run(stops))
        assert seen == [signal.SIGTERM] * 2
    finally:
        signal.signal(signal.SIGTERM, previous)


class StuckTrainer(StoppingTrainer):
    """The train call in progress when the stop comes does not end for a minute."""

    async def train(self, items, now_s):
        loss = await super().train(items, now_s)  # the call that asks for the stop
        if "stop" in self.calls:
            self.calls.append("stuck")
            await asyncio.sleep(60)
            self.calls.append("unstuck")  # only if the stop waited for the call
        return loss


@pytest.mark.parametrize(
    ("every", "says"),
    [
        ("live.checkpoint_min_interval_s=3600", "the run has no checkpoint: it starts over"),
        ("live.checkpoint_every=2", "the run resumes after step 1, its last checkpoint"),
    ],
    ids=["no-checkpoint", "checkpointed-before"],
)
def test_a_stop_past_its_grace_unwinds_without_a_checkpoint_and_says_so(
    every, says, tmp_path, caplog
):
    """Before: the stop waited for the trainer's job in progress without any limit."""
    spec = load_spec(CONFIG, [
        "pipeline.mode=stream-async", "run.iterations=8", f"algorithm.batch_size={BATCH}",
        "live.num_servers=1", "live.stop_grace_s=0.3", every,
    ])  # fmt: skip
    trainer = _run_until_stopped(spec, tmp_path / "last.pt", StuckTrainer, caplog)
    stop = trainer.calls.index("stop")
    assert "stuck" in trainer.calls[stop:] and "unstuck" not in trainer.calls
    assert not [c for c in trainer.calls[stop:] if c.startswith("checkpoint")]
    (warning,) = [r.getMessage() for r in caplog.records if "stop_grace_s" in r.getMessage()]
    assert "live.stop_grace_s (0.3 s)" in warning and "it did not checkpoint" in warning
    assert "the last trained step, 2, is not checkpointed" in warning and says in warning


class StuckCheckpointTrainer(StoppingTrainer):
    """The stop's checkpoint does not end for a minute (a large model's write)."""

    async def checkpoint(self, path, position):
        if "stop" in self.calls:
            self.calls.append("stuck")
            await asyncio.sleep(60)
            self.calls.append("unstuck")  # only if the stop waited for the call
        await super().checkpoint(path, position)


def test_a_stop_whose_checkpoint_runs_past_its_grace_says_the_write_may_still_land(
    tmp_path, caplog
):
    spec = load_spec(CONFIG, [
        "pipeline.mode=stream-async", "run.iterations=8", f"algorithm.batch_size={BATCH}",
        "live.num_servers=1", "live.stop_grace_s=0.3", "live.checkpoint_every=2",
    ])  # fmt: skip
    trainer = _run_until_stopped(spec, tmp_path / "last.pt", StuckCheckpointTrainer, caplog)
    assert trainer.calls[trainer.calls.index("stop") :] == ["stop", "train", "stuck"]
    (warning,) = [r.getMessage() for r in caplog.records if "stop_grace_s" in r.getMessage()]
    assert "waiting for its checkpoint: it did not checkpoint" in warning
    assert "resumes after step 1, its last checkpoint (or after step 2 if the trainer" in warning


def test_the_stop_grace_is_a_positive_number_of_seconds_named_when_wrong():
    from policies.spec import SpecError

    with pytest.raises(SpecError, match="live.stop_grace_s"):
        load_spec(CONFIG, ["live.stop_grace_s=0"])
    assert load_spec(CONFIG, []).live.stop_grace_s == 60.0


class ServersDieTrainer(StoppingTrainer):
    """Every server dies as the stop is asked (a SIGTERM to every process of a cgroup)."""

    async def train(self, items, now_s):
        if len(self.steps) == STOP_AFTER + 1:
            self.world.dead.add(0)
        return await super().train(items, now_s)


def test_servers_that_die_with_the_stop_do_not_keep_it_from_checkpointing(tmp_path):
    spec = load_spec(CONFIG, [
        "pipeline.mode=pipeline", "run.iterations=8", f"algorithm.batch_size={BATCH}",
        "live.num_servers=1", "live.checkpoint_min_interval_s=3600",
    ])  # fmt: skip
    trainer = _run_until_stopped(spec, tmp_path / "last.pt", ServersDieTrainer)
    stop = trainer.calls.index("stop")
    assert trainer.calls[stop + 1 :] == ["train", f"checkpoint {STOP_AFTER - 1}"]


class FakeTrainerProcess:
    """The launcher's trainer process, faked: the grace each stop of it was given."""

    given: list[float] = []

    def __init__(self, *args, **kwargs) -> None:
        self.pid = None

    def start(self) -> None:
        pass

    def stop(self, grace_s: float) -> None:
        self.given.append(grace_s)


def test_a_stop_past_its_grace_leaves_the_teardown_none_of_it(tmp_path, monkeypatch, caplog):
    """One deadline for the whole stop. Before: the actor waited all of live.stop_grace_s
    for the stuck call, then the teardown gave the trainer process all of it again (a stop
    out of grace took about twice live.stop_grace_s)."""
    from runtime import launcher
    from runtime.supervisor import Servers

    spec = load_spec(CONFIG, [
        "pipeline.mode=stream-async", "run.iterations=8", f"algorithm.batch_size={BATCH}",
        "live.num_servers=1", "live.stop_grace_s=0.5", "live.checkpoint_min_interval_s=3600",
    ])  # fmt: skip

    async def drive(spec, run_dir, trainer, servers, *args, stops=None, **kwargs):
        """The actor loop (a train call stuck when SIGTERM comes), as live_run runs it."""
        world = FakeWorld(1)
        stuck = StuckTrainer(world)
        stuck.request_stop = lambda: os.kill(os.getpid(), signal.SIGTERM)
        actor = make_actor(spec, {0: FakeClient(0, world)}, stuck, Recorder(), set(), 0,
                           str(run_dir.checkpoint), None, None, "gloo")  # fmt: skip
        await actor.push_now(0)
        with stops.listening(actor.request_stop):
            await actor.run()

    FakeTrainerProcess.given = []
    monkeypatch.setattr(launcher, "TrainerProcess", FakeTrainerProcess)
    monkeypatch.setattr(launcher, "drive", drive)
    monkeypatch.setattr(launcher, "model_dir_for", lambda spec: "no-model")
    monkeypatch.setattr(launcher, "trainer_config", lambda spec, model_dir: None)
    monkeypatch.setattr(launcher, "_core_loan", lambda spec, cores: None)
    monkeypatch.setattr(launcher, "_servers", lambda *args: Servers([], "token"))
    caplog.set_level("WARNING", logger="runtime.step_checkpoints")
    seen: list[int] = []
    previous = signal.signal(signal.SIGTERM, _unwinding(seen))
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            launcher.run_live(spec, tmp_path / "run")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert seen == [signal.SIGTERM]
    assert FakeTrainerProcess.given == [0.0]  # the actor's wait used the whole grace
    (warning,) = [r.getMessage() for r in caplog.records if "stop_grace_s" in r.getMessage()]
    assert "live.stop_grace_s (0.5 s)" in warning and "it did not checkpoint" in warning
    assert "the run has no checkpoint: it starts over" in warning
