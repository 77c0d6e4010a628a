"""Resuming a live run: the prompt source hands out every untrained sample exactly once."""

from runtime.live_run import ResumablePrompts
from runtime.tasks import TaskPromptSource, TaskSet

BATCH, GROUP = 8, 4


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
