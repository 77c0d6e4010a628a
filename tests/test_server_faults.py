"""A lost generation server, without real servers: the actor, a real controller, fakes
(tests/server_fakes.py).

Every sample must be trained exactly once with its own id; the loss is recorded; with a
restart the server comes back at the weight version of the next push; with no server
left the run stops with one line naming the dead process; a stream broken on a live
server is sent again; a dead or hung engine is a lost server.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_fakes import BATCH, FakeClient, FakeWorld, fake_actor, run_actor

from runtime.errors import LiveRunError
from runtime.gen_client import GenerationClient, SampleFailed
from runtime.http_pool import POOL_LIMITS, SERVER_KEEP_ALIVE_S
from runtime.server_faults import ServersLost


class ResettingClient(FakeClient):
    """Its stream breaks with a reset connection (``httpx.ReadError``) after every
    ``every`` completions, ``resets`` times in all, while its server lives on."""

    def __init__(self, instance_id: int, world: FakeWorld, every: int, resets: int) -> None:
        super().__init__(instance_id, world)
        self.every, self.resets, self._since = every, resets, 0

    async def stream(self, requests, dispatch_s, clock, priorities, seeds):
        for r in requests:
            if self.resets and self._since >= self.every:
                self.resets, self._since = self.resets - 1, 0
                raise httpx.ReadError("")
            self._since += 1
            async for out in super().stream((r,), dispatch_s, clock, priorities, seeds):
                yield out


class FailingEngineClient(FakeClient):
    """After ``after`` completions its server's engine fails as ``how`` says: ``"dies"``:
    the next sample comes back as an error line (``EngineDeadError``), as vLLM's frontend
    reports it, and the server is gone; ``"hangs"``: the stream stays open with nothing
    more on it, the process lives, and ``/health`` says stalled."""

    def __init__(self, instance_id: int, world: FakeWorld, after: int, how: str) -> None:
        super().__init__(instance_id, world)
        self.after, self.how = after, how

    async def stream(self, requests, dispatch_s, clock, priorities, seeds):
        for r in requests:
            if len(self.dispatched) >= self.after and self.how == "dies":
                self.world.dead.add(self.instance_id)
                raise SampleFailed(r, self.instance_id, "EngineDeadError: EngineCore died")
            if len(self.dispatched) >= self.after:
                self.world.hung.add(self.instance_id)
                await asyncio.Event().wait()  # as long as the stream's read timeout
            async for out in super().stream((r,), dispatch_s, clock, priorities, seeds):
                yield out


@pytest.mark.parametrize("mode", ["stream-sync", "stream-async", "pipeline"])
def test_a_lost_servers_samples_go_to_the_other_with_their_ids_and_none_twice(mode):
    actor, world, trainer, recorder = fake_actor(mode, 2, break_after=3, restart=False)
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    lost = [f for f in recorder.faults if f.event == "lost"]
    assert [(f.instance_id, "SIGKILL" in f.detail) for f in lost] == [(1, True)]
    assert lost[0].num_resubmitted > 0
    samples = recorder.samples
    assert len(samples) == 4 * BATCH and all(s.train_step is not None for s in samples.values())
    late = [s for s in samples.values() if s.instance_id == 1]
    assert len(late) == 3  # what it returned before dying; the rest went to server 0
    assert trainer.joins and trainer.joins[0] == ["http://fake-0"]  # the group without it


def test_a_lost_server_is_logged_naming_it_why_and_its_resubmitted_samples(caplog):
    """Before: the loss went to faults.json only, not to the console or run.log."""
    actor, world, trainer, recorder = fake_actor("stream-async", 2, break_after=3, restart=False)
    with caplog.at_level("WARNING", logger="runtime.server_faults"):
        asyncio.run(run_actor(actor))
    (lost,) = [f for f in recorder.faults if f.event == "lost"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "runtime.server_faults"]
    assert warnings == [
        f"generation server 1 lost: generation server 1 (pid 41) killed by SIGKILL; "
        f"{lost.num_resubmitted} unreturned samples go to the others"
    ]


def test_a_restarted_server_rejoins_at_the_next_push_and_serves_that_version():
    actor, world, trainer, recorder = fake_actor("stream-async", 2, break_after=2, restart=True)

    async def after_step(step: int) -> None:  # hold the trainer until the server is back
        while step == 0 and not any(f.event == "restarted" for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))
    events = [(f.event, f.instance_id) for f in recorder.faults]
    assert events == [("lost", 1), ("restarted", 1), ("rejoined", 1)]
    rejoined = recorder.faults[-1]
    assert rejoined.version >= 1  # the version of the push after step 0 (or later)
    assert trainer.joins[-1] == ["http://fake-0", "http://fake-1"]
    back = world.clients_made[-1]
    assert back.dispatched  # it took work again
    versions = {recorder.samples[sid].version_start for sid in back.dispatched}
    assert min(versions) >= rejoined.version  # at the version of the push it joined with


def test_with_one_server_a_loss_stops_the_run_naming_the_process():
    actor, *_ = fake_actor("stream-async", 1, break_after=5, restart=False)
    with pytest.raises(ServersLost) as info:
        asyncio.run(run_actor(actor))
    message = str(info.value)
    assert "generation server 0 (pid 40) killed by SIGKILL" in message
    assert "\n" not in message
    assert isinstance(info.value, LiveRunError)


def test_a_stream_broken_on_a_live_server_sends_it_what_it_had_not_returned_again():
    actor, world, trainer, recorder = fake_actor("pipeline", 2, break_after=None, restart=False)
    flaky = actor.clients[1] = ResettingClient(1, world, every=3, resets=2)
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    assert sorted(flaky.dispatched) == sorted(
        sid for sid, s in recorder.samples.items() if s.instance_id == 1
    )  # nothing it streamed twice, nothing lost
    assert [(f.event, f.instance_id) for f in recorder.faults] == [("retried", 1)] * 2
    assert all(f.num_resubmitted > 0 and "ReadError" in f.detail for f in recorder.faults)
    assert not actor.faults.is_lost(1) and world.stopped == []


def test_a_stream_that_keeps_breaking_on_a_live_server_stops_the_run_saying_so():
    actor, world, *_ = fake_actor("pipeline", 2, break_after=None, restart=False)
    actor.clients[1] = ResettingClient(1, world, every=0, resets=10**6)
    with pytest.raises(LiveRunError, match="server 1's stream broke .*still answers /health"):
        asyncio.run(run_actor(actor))


def test_the_clients_let_idle_connections_go_before_the_server_closes_them():
    """A connection reused just as the server closes it breaks with a ReadError (it once
    stopped a 300-step run): pools to the servers drop idle connections well before."""
    client = GenerationClient(0, "http://127.0.0.1:9", 1.0)
    expiry = client.http._transport._pool._keepalive_expiry
    assert expiry == POOL_LIMITS.keepalive_expiry and expiry <= SERVER_KEEP_ALIVE_S / 2


def test_a_dead_engines_error_line_is_a_lost_server_not_a_failed_run():
    """Seen live: a server whose engine died (or that the run stopped as lost) answered its
    held samples with EngineDeadError lines, and the run stopped on the first one."""
    actor, world, trainer, recorder = fake_actor("stream-async", 2, break_after=None, restart=False)
    actor.clients[1] = FailingEngineClient(1, world, after=3, how="dies")
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once, on server 0
    lost = [f for f in recorder.faults if f.event == "lost"]
    assert [f.instance_id for f in lost] == [1]


def test_a_server_whose_engine_hangs_is_lost_by_its_health_not_its_streams_timeout():
    """Seen live: an engine stopped with requests on it held the run until the stream's
    read timeout (120 s); its /health said stalled long before."""
    actor, world, trainer, recorder = fake_actor("stream-async", 2, break_after=None, restart=False)
    actor.clients[1] = FailingEngineClient(1, world, after=3, how="hangs")
    actor.faults.health_period_s = 0.05
    asyncio.run(run_actor(actor))  # without the probe: hangs until wait_for's 30 s
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    lost = [f for f in recorder.faults if f.event == "lost"]
    assert [f.instance_id for f in lost] == [1] and "503 stalled" in lost[0].detail
    assert world.stopped == [1]
