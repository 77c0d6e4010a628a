"""Fakes of a live run's servers and trainer for the actor with a real controller: no
vLLM, no torch. Fake clients stream completions (one may break its connection
mid-dispatch, as a killed server does), a fake trainer records what it trains, fake
servers say who is dead. Used by the server-loss, push and elastic tests, the graceful
stop's and the resume's."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx

from policies.records import Completion, FinishReason, StepStats
from policies.spec import load_spec
from runtime.actor import Actor
from runtime.gen_client import Generated
from runtime.live_run import make_actor
from runtime.recorder import Recorder
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
            yield Generated(completion(r, self.instance_id, version, clock()), "x", (1, 2))

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


def completion(r, instance_id: int, version: int, now: float) -> Completion:
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


def fake_actor(
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


async def run_actor(actor: Actor) -> float:
    await actor.push_now(0)
    return await asyncio.wait_for(actor.run(), 30)
