"""A lost generation server, without real servers: the actor, a real controller, fakes.

Fake clients stream completions (one of them breaks its connection mid-dispatch, as a
killed server does), a fake trainer records what it trains, fake servers say who is dead.
Every sample must be trained exactly once with its own id; the loss is recorded; with a
restart the server comes back at the weight version of the next push; with no server
left the run stops with one line naming the dead process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import scripted_scaling

from policies.records import Completion, FinishReason, StepStats
from policies.spec import load_spec
from runtime.actor import Actor
from runtime.errors import LiveRunError
from runtime.gen_client import Generated, GenerationClient, SampleFailed
from runtime.http_pool import POOL_LIMITS, SERVER_KEEP_ALIVE_S
from runtime.live_run import make_actor
from runtime.recorder import Recorder
from runtime.server_faults import ServersLost
from runtime.supervisor import Servers, ServerSlot
from runtime.trainer_proc import PushResult

CONFIG = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "live-tiny.yaml"
BATCH = 8


class FakeClient:
    """Streams each request back at once; ``break_after`` completions, then the connection
    breaks (and any later dispatch fails to connect), like a server killed mid-stream."""

    def __init__(self, instance_id: int, world: FakeWorld, break_after: int | None = None):
        self.instance_id, self.world, self.break_after = instance_id, world, break_after
        self.base_url, self.temperature, self.api_key = f"http://fake-{instance_id}", 1.0, None
        self.dispatched: list[int] = []  # sample ids streamed back

    async def stream(self, requests, dispatch_s, clock, priorities, seeds):
        for r in requests:
            await asyncio.sleep(0)
            if self.instance_id in self.world.dead:
                raise httpx.ConnectError("connection refused")
            if self.break_after is not None and len(self.dispatched) >= self.break_after:
                self.world.dead.add(self.instance_id)
                raise httpx.RemoteProtocolError("peer closed connection")
            self.dispatched.append(r.sample_id)
            version = self.world.served[self.instance_id]
            yield Generated(_completion(r, self.instance_id, version, clock()), "x", (1, 2))

    def for_instance(self, instance_id: int, base_url: str) -> FakeClient:
        self.world.served[instance_id] = -1  # serves nothing until a push reaches it
        client = FakeClient(instance_id, self.world)
        self.world.clients_made.append(client)
        return client

    def reconnected(self, base_url: str) -> FakeClient:
        client = FakeClient(self.instance_id, self.world)
        self.world.clients_made.append(client)
        return client

    async def unwell(self) -> str | None:
        return "answers /health 503 stalled" if self.instance_id in self.world.hung else None

    async def aclose(self) -> None:
        pass


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


def _completion(r, instance_id: int, version: int, now: float) -> Completion:
    return Completion(
        request=r, instance_id=instance_id, output_tokens=2, finish_reason=FinishReason.STOP,
        version_start=version, version_end=version, dispatch_s=now, gen_start_s=now,
        gen_end_s=now, token_ids=(3, 1), logprobs=(-1.0, -1.0),
    )  # fmt: skip


class FakeWorld:
    def __init__(self, num_servers: int) -> None:
        self.dead: set[int] = set()
        self.hung: set[int] = set()  # alive, their engines stalled
        self.served = dict.fromkeys(range(num_servers), 0)  # instance -> version it serves
        self.clients_made: list[FakeClient] = []
        self.stopped: list[int] = []


class FakeTrainer:
    def __init__(self, world: FakeWorld) -> None:
        self.world = world
        self.trained: list[int] = []
        self.group: list[str] = [f"http://fake-{i}" for i in world.served]
        self.joins: list[list[str]] = []
        self.sent: int | None = None

    async def train(self, items, now_s):
        self.trained += [it.sample_id for it in items]
        return 0.0

    async def step(self, step, now_s):
        return StepStats(step, step + 1, BATCH, 16, now_s, now_s, 0.0, 0.5, 0.0, 1.0, 0.0)

    async def checkpoint(self, path, position):
        pass

    async def join_group(self, servers, host, port, backend):
        self.group = [s.base_url for s in servers]
        self.joins.append(self.group)

    async def send_weights(self, version):
        self.sent = version

    async def push_answers(self):
        assert self.sent is not None, "answers read before weights were sent"
        version, self.sent = self.sent, None
        ids = [int(url.rsplit("-", 1)[1]) for url in self.group]
        failures = {k: "ConnectError" for k, i in enumerate(ids) if i in self.world.dead}
        for i in ids:
            if i not in self.world.dead:
                self.world.served[i] = version
        return PushResult(version, [0.0] * len(ids), [{}] * len(ids), failures)


class FakeServers(Servers):
    def __init__(self, world: FakeWorld, restart: bool) -> None:
        slots = [ServerSlot(i, f"http://fake-{i}") for i in world.served]
        super().__init__(slots, "token", (lambda i: None) if restart else None, restarts=restart)
        self.world = world

    @property
    def can_add(self) -> bool:
        return True

    def exited(self, instance_id: int) -> bool:
        return instance_id in self.world.dead

    async def confirm_lost(self, instance_id: int, cause: str) -> str | None:
        if instance_id in self.world.dead:
            return f"generation server {instance_id} (pid 4{instance_id}) killed by SIGKILL"
        if instance_id in self.world.hung:
            return f"generation server {instance_id} answers /health 503 stalled ({cause})"
        return None

    def stop(self, instance_id: int) -> None:
        self.world.stopped.append(instance_id)

    async def add(self, instance_id: int) -> ServerSlot:
        await asyncio.sleep(0.01)
        slot = ServerSlot(instance_id, f"http://fake-{instance_id}")
        self.slots[instance_id] = slot
        return slot

    async def restart(self, instance_id: int):
        await asyncio.sleep(0.01)
        self.world.dead.discard(instance_id)
        return SimpleNamespace(base_url=f"http://fake-{instance_id}", proc=SimpleNamespace(pid=7))


def _actor(
    mode: str, num_servers: int, break_after: int | None, restart: bool, iterations: int = 4,
    sets: tuple[str, ...] = (),
):  # fmt: skip
    spec = load_spec(
        CONFIG,
        [f"pipeline.mode={mode}", f"run.iterations={iterations}", f"algorithm.batch_size={BATCH}",
         f"live.num_servers={num_servers}", *sets],
    )  # fmt: skip
    world = FakeWorld(num_servers)
    clients = {i: FakeClient(i, world) for i in range(num_servers)}
    clients[num_servers - 1].break_after = break_after
    trainer = FakeTrainer(world)
    recorder = Recorder()
    actor: Actor = make_actor(spec, clients, trainer, recorder, set(), 0, None, None, None, "gloo")
    actor.faults.servers = FakeServers(world, restart)
    return actor, world, trainer, recorder


async def _run(actor: Actor) -> float:
    await actor.push_now(0)
    return await asyncio.wait_for(actor.run(), 30)


@pytest.mark.parametrize("mode", ["stream-sync", "stream-async", "pipeline"])
def test_a_lost_servers_samples_go_to_the_other_with_their_ids_and_none_twice(mode):
    actor, world, trainer, recorder = _actor(mode, 2, break_after=3, restart=False)
    asyncio.run(_run(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    lost = [f for f in recorder.faults if f.event == "lost"]
    assert [(f.instance_id, "SIGKILL" in f.detail) for f in lost] == [(1, True)]
    assert lost[0].num_resubmitted > 0
    samples = recorder.samples
    assert len(samples) == 4 * BATCH and all(s.train_step is not None for s in samples.values())
    late = [s for s in samples.values() if s.instance_id == 1]
    assert len(late) == 3  # what it returned before dying; the rest went to server 0
    assert trainer.joins and trainer.joins[0] == ["http://fake-0"]  # the group without it


def test_a_restarted_server_rejoins_at_the_next_push_and_serves_that_version():
    actor, world, trainer, recorder = _actor("stream-async", 2, break_after=2, restart=True)

    async def after_step(step: int) -> None:  # hold the trainer until the server is back
        while step == 0 and not any(f.event == "restarted" for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    asyncio.run(_run(actor))
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
    actor, *_ = _actor("stream-async", 1, break_after=5, restart=False)
    with pytest.raises(ServersLost) as info:
        asyncio.run(_run(actor))
    message = str(info.value)
    assert "generation server 0 (pid 40) killed by SIGKILL" in message
    assert "\n" not in message
    assert isinstance(info.value, LiveRunError)


def test_a_stream_broken_on_a_live_server_sends_it_what_it_had_not_returned_again():
    actor, world, trainer, recorder = _actor("pipeline", 2, break_after=None, restart=False)
    flaky = actor.clients[1] = ResettingClient(1, world, every=3, resets=2)
    asyncio.run(_run(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    assert sorted(flaky.dispatched) == sorted(
        sid for sid, s in recorder.samples.items() if s.instance_id == 1
    )  # nothing it streamed twice, nothing lost
    assert [(f.event, f.instance_id) for f in recorder.faults] == [("retried", 1)] * 2
    assert all(f.num_resubmitted > 0 and "ReadError" in f.detail for f in recorder.faults)
    assert not actor.faults.is_lost(1) and world.stopped == []


def test_a_stream_that_keeps_breaking_on_a_live_server_stops_the_run_saying_so():
    actor, world, *_ = _actor("pipeline", 2, break_after=None, restart=False)
    actor.clients[1] = ResettingClient(1, world, every=0, resets=10**6)
    with pytest.raises(LiveRunError, match="server 1's stream broke .*still answers /health"):
        asyncio.run(_run(actor))


def test_a_push_that_finds_a_server_dead_goes_again_without_it():
    actor, world, trainer, recorder = _actor("disagg-sync", 2, break_after=10**6, restart=False)

    async def scenario() -> None:
        await actor.push_now(0)
        world.dead.add(1)  # dies between pushes, with nothing running
        result = await actor.push_now(1)
        assert result.failures == {}
        assert trainer.group == ["http://fake-0"]
        assert world.served[0] == 1

    asyncio.run(scenario())
    assert actor.faults.is_lost(1)


def test_elastic_adds_a_server_that_serves_current_weights_then_retires_it_drained():
    actor, world, trainer, recorder = _actor(
        "disagg-sync", 2, break_after=None, restart=False, iterations=6,
        sets=[f"policies.allocation={scripted_scaling.register()}"],
    )  # fmt: skip

    async def after_step(step: int) -> None:  # hold the trainer until the server is up
        while step == 1 and not any(f.event == "added" for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    asyncio.run(_run(actor))
    assert sorted(trainer.trained) == list(range(6 * BATCH))  # each sample once
    events = [(f.event, f.instance_id) for f in recorder.faults]
    assert events == [("added", 2), ("rejoined", 2), ("retired", 2)]
    joined, retired = recorder.faults[1], recorder.faults[2]
    served = [s for s in recorder.samples.values() if s.instance_id == 2]
    assert served and all(s.version_start >= joined.version for s in served)
    assert all(s.gen_end_s <= retired.time_s for s in served)
    assert world.stopped == [2]
    assert trainer.joins[-1] == ["http://fake-0", "http://fake-1"]  # left the group


class LoadingTrainer(FakeTrainer):
    """Servers that take a while to load: the answers to a push come only once the trainer
    has trained again (or after ~0.5 s); every call is logged in order."""

    def __init__(self, world: FakeWorld) -> None:
        super().__init__(world)
        self.log: list[tuple[str, int]] = []

    async def send_weights(self, version):
        self.log.append(("send", version))
        await super().send_weights(version)

    async def push_answers(self):
        for _ in range(500):
            if self.log[-1][0] != "send":
                break
            await asyncio.sleep(0.001)
        result = await super().push_answers()
        self.log.append(("answers", result.version))
        return result

    async def train(self, items, now_s):
        self.log.append(("train", len(items)))
        return await super().train(items, now_s)

    async def step(self, step, now_s):
        self.log.append(("step", step))
        return await super().step(step, now_s)


def test_the_trainer_trains_while_the_servers_load_and_steps_only_once_they_answered():
    actor, world, _, _ = _actor("pipeline", 1, break_after=None, restart=False, iterations=4)
    trainer = LoadingTrainer(world)
    actor.trainer = trainer
    asyncio.run(_run(actor))
    log = trainer.log
    for version in (1, 2, 3):  # pushed after steps 0, 1, 2 (the run ends at step 3)
        between = log[log.index(("send", version)) + 1 : log.index(("answers", version))]
        assert any(kind == "train" for kind, _ in between), (version, log)
        assert not any(kind == "step" for kind, _ in between), (version, log)
    assert sorted(trainer.trained) == list(range(4 * BATCH))


def test_a_steps_end_is_when_the_actor_finished_it_not_the_trainers_busy_sum():
    actor, world, trainer, recorder = _actor("pipeline", 2, break_after=10**6, restart=False)

    async def busy_step(step, now_s):  # a step whose micro-batches took 100 s, overlapped
        return StepStats(step, step + 1, BATCH, 16, now_s, now_s + 100.0, 0.0, 0.5, 0.0, 100.0)

    trainer.step = busy_step
    end_s = asyncio.run(_run(actor))
    assert len(recorder.steps) == 4
    for s in recorder.steps:
        assert s["start_s"] <= s["end_s"] <= s["done_s"] <= end_s < 100.0


def test_the_clients_let_idle_connections_go_before_the_server_closes_them():
    """A connection reused just as the server closes it breaks with a ReadError (it once
    stopped a 300-step run): pools to the servers drop idle connections well before."""
    client = GenerationClient(0, "http://127.0.0.1:9", 1.0)
    expiry = client.http._transport._pool._keepalive_expiry
    assert expiry == POOL_LIMITS.keepalive_expiry and expiry <= SERVER_KEEP_ALIVE_S / 2


def test_a_dead_engines_error_line_is_a_lost_server_not_a_failed_run():
    """Seen live: a server whose engine died (or that the run stopped as lost) answered its
    held samples with EngineDeadError lines, and the run stopped on the first one."""
    actor, world, trainer, recorder = _actor("stream-async", 2, break_after=None, restart=False)
    actor.clients[1] = FailingEngineClient(1, world, after=3, how="dies")
    asyncio.run(_run(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once, on server 0
    lost = [f for f in recorder.faults if f.event == "lost"]
    assert [f.instance_id for f in lost] == [1]


def test_a_server_whose_engine_hangs_is_lost_by_its_health_not_its_streams_timeout():
    """Seen live: an engine stopped with requests on it held the run until the stream's
    read timeout (120 s); its /health said stalled long before."""
    actor, world, trainer, recorder = _actor("stream-async", 2, break_after=None, restart=False)
    actor.clients[1] = FailingEngineClient(1, world, after=3, how="hangs")
    actor.faults.health_period_s = 0.05
    asyncio.run(_run(actor))  # without the probe: hangs until wait_for's 30 s
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    lost = [f for f in recorder.faults if f.event == "lost"]
    assert [f.instance_id for f in lost] == [1] and "503 stalled" in lost[0].detail
    assert world.stopped == [1]
