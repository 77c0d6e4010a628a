"""Resuming a live run: the prompt source hands out every untrained sample exactly once;
the trainer sees each sample's weight version in its own (global) numbering."""

import asyncio

import pytest
from server_fakes import BATCH, CONFIG, FakeClient, FakeTrainer, FakeWorld

from policies.spec import load_spec
from runtime.live_run import ResumablePrompts, make_actor
from runtime.recorder import DataPosition, Recorder
from runtime.tasks import TaskPromptSource, TaskSet

GROUP = 4


def _source() -> TaskPromptSource:
    return TaskPromptSource(TaskSet(0, 64, 64), BATCH, GROUP)


def test_a_fresh_run_gets_the_source_batches_unchanged():
    prompts = ResumablePrompts(_source(), set())
    for i in range(5):
        assert prompts.batch(i) == _source().batch(i)
    assert prompts.iteration_of == {i: i // BATCH for i in range(5 * BATCH)}


def test_a_resumed_wave_run_starts_at_the_next_iteration():
    trained = set(range(3 * BATCH))  # wave modes: steps 0..2 trained iterations 0..2
    prompts = ResumablePrompts(_source(), trained)
    batch = prompts.batch(0)
    assert [r.sample_id for r in batch] == list(range(3 * BATCH, 4 * BATCH))
    assert all(r.iteration == 0 for r in batch)  # the resumed controller counts from 0
    assert {prompts.iteration_of[r.sample_id] for r in batch} == {3}


def test_a_resumed_pipeline_run_regenerates_earlier_untrained_groups_first():
    # pipeline: steps 0..1 trained whole groups from iterations 0..2, out of order
    groups_trained = [0, 2, 3, 5]  # group g holds sample ids 4g..4g+3
    trained = {4 * g + j for g in groups_trained for j in range(GROUP)}
    prompts = ResumablePrompts(_source(), trained)
    ids = [r.sample_id for i in range(3) for r in prompts.batch(i)]
    expected = [s for s in range(40) if s not in trained][: len(ids)]
    assert ids == expected and len(set(ids)) == len(ids)
    assert not trained & set(ids)
    for k in range(0, len(ids), GROUP):  # groups stay whole and in order
        assert len({s // GROUP for s in ids[k : k + GROUP]}) == 1
    assert all(prompts.iteration_of[s] == s // BATCH for s in ids)


class _LagTrainer(FakeTrainer):
    """A fake trainer at a resumed run's global version: each trained sample's lag, as
    ``runtime.trainer.Trainer`` computes it (its version minus the sample's)."""

    def __init__(self, world: FakeWorld, version: int) -> None:
        super().__init__(world)
        self.version, self.lags = version, []

    async def train(self, items, now_s):
        self.lags += [self.version - it.version_start for it in items]
        return await super().train(items, now_s)

    async def step(self, step, now_s):
        self.version = step + 1
        return await super().step(step, now_s)


@pytest.mark.parametrize(("mode", "max_lag"), [("disagg-sync", 0), ("pipeline", 1)])
def test_a_resumed_runs_lags_count_in_the_trainers_global_versions(mode, max_lag):
    """Resumed at step 3, the trainer is at version 3 and the servers serve version 3: a
    sample's version must reach the trainer in that numbering, not the resumed
    controller's (which counts from 0 and made every lag 3 too large)."""
    offset, iterations = 3, 6
    spec = load_spec(CONFIG, [f"pipeline.mode={mode}", f"run.iterations={iterations}",
                              f"algorithm.batch_size={BATCH}", "live.num_servers=1"])  # fmt: skip
    world = FakeWorld(1)
    world.served[0] = offset
    trainer = _LagTrainer(world, offset)
    trained = set(range(offset * BATCH))  # the first part's steps trained these
    actor = make_actor(spec, {0: FakeClient(0, world)}, trainer, Recorder(), trained, offset,
                       None, None, None, "gloo")  # fmt: skip

    async def run() -> None:
        await actor.push_now(offset)
        await asyncio.wait_for(actor.run(), 30)

    asyncio.run(run())
    assert len(trainer.lags) == (iterations - offset) * BATCH
    assert set(trainer.lags) <= set(range(max_lag + 1)) and 0 in trainer.lags


class _CheckpointTrainer(FakeTrainer):
    """Keeps the step of each checkpoint it is asked to write."""

    def __init__(self, world: FakeWorld) -> None:
        super().__init__(world)
        self.checkpointed: list[int] = []

    async def checkpoint(self, path, position):
        self.checkpointed.append(position.next_step - 1)


def test_a_resumed_run_checkpoints_on_its_cadence_timed_from_its_checkpoint(tmp_path):
    """Resumed after step 2, its checkpoint taken 5000 s into the run, with at most one
    checkpoint an hour: only the run's last step checkpoints. Before: the interval ran
    from the clock's zero, so the first step after every resume checkpointed too."""
    offset, iterations, checkpoint_s = 3, 6, 5000.0
    spec = load_spec(CONFIG, [
        "pipeline.mode=disagg-sync", f"run.iterations={iterations}",
        f"algorithm.batch_size={BATCH}", "live.num_servers=1",
        "live.checkpoint_min_interval_s=3600",
    ])  # fmt: skip
    world = FakeWorld(1)
    world.served[0] = offset
    trainer = _CheckpointTrainer(world)
    recorder = Recorder.resumed(DataPosition(offset, checkpoint_s, [], [], [], journal=True))
    trained = set(range(offset * BATCH))
    actor = make_actor(spec, {0: FakeClient(0, world)}, trainer, recorder, trained, offset,
                       str(tmp_path / "last.pt"), None, None, "gloo")  # fmt: skip

    async def run() -> None:
        actor.start_clock(checkpoint_s)
        await actor.push_now(offset)
        await asyncio.wait_for(actor.run(), 30)

    asyncio.run(run())
    assert trainer.checkpointed == [iterations - 1]
