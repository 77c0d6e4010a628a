"""Pieces of the live actor that need no server: the trainer job queue and sampling seeds."""

import asyncio

from policies.records import Request
from runtime.actor import ActorConfig
from runtime.jobs import JobQueue


def test_jobs_run_in_order_and_a_push_jumps_ahead_of_queued_training():
    async def drain() -> list[str]:
        queue = JobQueue()
        for name in ("train-a", "step", "train-b"):
            queue.put(name)
        queue.put_first("push")
        return [await queue.get() for _ in range(4)]

    assert asyncio.run(drain()) == ["push", "train-a", "step", "train-b"]


def test_a_waiting_trainer_wakes_for_the_next_job():
    async def scenario() -> str:
        queue = JobQueue()
        waiter = asyncio.create_task(queue.get())
        await asyncio.sleep(0)
        assert not waiter.done()
        queue.put("train")
        return await asyncio.wait_for(waiter, 1.0)

    assert asyncio.run(scenario()) == "train"


def _request(sample_id: int) -> Request:
    return Request(
        sample_id=sample_id,
        prompt_id=0,
        group_id=0,
        iteration=0,
        prompt_tokens=4,
        max_tokens=16,
    )


def test_each_sample_has_its_own_seed_stable_across_runs_and_changing_with_the_run_seed():
    a, b = ActorConfig(group_size=4, sampling_seed=0), ActorConfig(group_size=4, sampling_seed=1)
    seeds = [a.seed_of(_request(i)) for i in range(100)]
    assert len(set(seeds)) == 100
    assert seeds == [
        ActorConfig(group_size=4, sampling_seed=0).seed_of(_request(i)) for i in range(100)
    ]
    assert all(0 <= s < 2**31 for s in seeds)
    assert b.seed_of(_request(7)) != a.seed_of(_request(7))
    assert ActorConfig(group_size=4, sampling_seed=None).seed_of(_request(7)) is None


def test_the_warm_up_batch_has_the_shape_of_an_iteration_and_zero_tokens_turns_it_off():
    from pathlib import Path

    from policies.spec import load_spec
    from runtime.host_cpu import process_age_s
    from runtime.warm_up import warm_up_requests, warm_up_servers

    config = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"
    spec = load_spec(config, ["algorithm.batch_size=12", "live.warm_up_tokens=5"])
    batch = warm_up_requests(spec)
    assert len(batch) == 12 and {r.max_tokens for r in batch} == {5}
    assert all(r.prompt for r in batch)

    class Unreachable:
        def stream(self, *args, **kwargs):
            raise AssertionError("no warm-up was asked for")

    off = load_spec(config, ["live.warm_up_tokens=0"])
    assert asyncio.run(warm_up_servers({0: Unreachable()}, off)) == 0.0
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    assert 0 < process_age_s() < uptime_s
