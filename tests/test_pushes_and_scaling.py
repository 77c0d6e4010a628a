"""Weight pushes and elastic generation, without real servers: the actor, a real
controller, fakes (tests/server_fakes.py). A push that finds a server dead goes again
without it; the trainer trains while the servers load and steps once they answered; a
step ends when the actor finished it; elastic scale-out adds a server that serves
current weights and retires it drained, one that adds no server lets the controller
scale again, a lost server restarted meanwhile is not taken for the scale-out's, and a
scale-out of two servers ends once, at the one settled last.
"""

from __future__ import annotations

import asyncio

import pytest
import scripted_scaling
from server_fakes import BATCH, FakeServers, FakeTrainer, FakeWorld, fake_actor, run_actor

from policies.modes.events import InstanceAdded, ScaleOut, ScaleOutFailed
from policies.records import StepStats
from runtime.errors import ProcessDied
from runtime.supervisor import ServerSlot


def test_a_push_that_finds_a_server_dead_goes_again_without_it():
    actor, world, trainer, recorder = fake_actor("disagg-sync", 2, break_after=10**6, restart=False)

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
    actor, world, trainer, recorder = fake_actor(
        "disagg-sync", 2, break_after=None, restart=False, iterations=6,
        sets=[f"policies.allocation={scripted_scaling.register()}"],
    )  # fmt: skip

    async def after_step(step: int) -> None:  # hold the trainer until the server is up
        while step == 1 and not any(f.event == "added" for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    asyncio.run(run_actor(actor))
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
    actor, world, _, _ = fake_actor("pipeline", 1, break_after=None, restart=False, iterations=4)
    trainer = LoadingTrainer(world)
    actor.trainer = trainer
    asyncio.run(run_actor(actor))
    log = trainer.log
    for version in (1, 2, 3):  # pushed after steps 0, 1, 2 (the run ends at step 3)
        between = log[log.index(("send", version)) + 1 : log.index(("answers", version))]
        assert any(kind == "train" for kind, _ in between), (version, log)
        assert not any(kind == "step" for kind, _ in between), (version, log)
    assert sorted(trainer.trained) == list(range(4 * BATCH))


def test_a_steps_end_is_when_the_actor_finished_it_not_the_trainers_busy_sum():
    actor, world, trainer, recorder = fake_actor("pipeline", 2, break_after=10**6, restart=False)

    async def busy_step(step, now_s):  # a step whose micro-batches took 100 s, overlapped
        return StepStats(step, step + 1, BATCH, 16, now_s, now_s + 100.0, 0.0, 0.5, 0.0, 100.0)

    trainer.step = busy_step
    end_s = asyncio.run(run_actor(actor))
    assert len(recorder.steps) == 4
    for s in recorder.steps:
        assert s["start_s"] <= s["end_s"] <= s["done_s"] <= end_s < 100.0


class FailingServers(FakeServers):
    """Servers whose every added one fails to start (``dies``: starts, then its process
    exits before it joins the weight group; ``restart-fails``: so, and then its restart
    fails), or none can be added (``attached``)."""

    def __init__(self, world: FakeWorld, how: str) -> None:
        super().__init__(world, restart=how == "restart-fails")
        self.how, self.attempts = how, 0

    @property
    def can_add(self) -> bool:
        return self.how != "attached"

    async def add(self, instance_id: int) -> ServerSlot:
        self.attempts += 1
        slot = await super().add(instance_id)
        if self.how == "fails":
            raise ProcessDied(f"generation server {instance_id} exited during start-up")
        self.world.dead.add(instance_id)
        return slot

    async def restart(self, instance_id: int):
        await asyncio.sleep(0.01)
        raise ProcessDied(f"generation server {instance_id} exited during start-up again")


@pytest.mark.parametrize("how", ["fails", "dies", "restart-fails", "attached"])
def test_a_scale_out_that_adds_no_server_lets_the_controller_scale_again(how, caplog):
    """Before: the controller waited for the first scale-out's server for the rest of the
    run and never scaled again (one attempt in 4 steps, whatever the rule said); so still
    where the server was lost before it joined and its restart failed."""
    actor, world, trainer, recorder = fake_actor(
        "disagg-sync", 2, break_after=None, restart=False, iterations=4,
        sets=[f"policies.allocation={scripted_scaling.register_always_add()}"],
    )  # fmt: skip
    servers = actor.faults.servers = FailingServers(world, how)
    gone = {"fails": "add-failed", "dies": "lost", "restart-fails": "restart-failed"}.get(how)

    async def after_step(step: int) -> None:  # a scale-out in flight ends before the next
        while servers.attempts > sum(f.event == gone for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    caplog.set_level("WARNING", logger="runtime.server_faults")
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    said = [r.getMessage() for r in caplog.records if "added no server" in r.getMessage()]
    assert len(said) == 3  # asked again after steps 1 and 2, not only after step 0
    assert servers.attempts == (0 if how == "attached" else 3)
    why = {"fails": "server 2 did not start (generation server 2 exited during start-up)",
           "dies": "server 2 was lost before it joined (generation server 2 (pid 42) killed",
           "restart-fails": "server 2 was lost before it joined and its restart failed "
                            "(generation server 2 exited during start-up again)",
           "attached": "the run attached to its servers (live.server_urls)"}[how]  # fmt: skip
    assert said[0].startswith(f"elastic scale-out added no server: {why}")
    assert sorted(actor.controller.views) == [0, 1]


class StartingServers(FakeServers):
    """Servers restarted at once, while an added one stays starting for the whole run."""

    def __init__(self, world: FakeWorld) -> None:
        super().__init__(world, restart=True)
        self.attempts = 0

    async def add(self, instance_id: int) -> ServerSlot:
        self.attempts += 1
        await asyncio.Event().wait()  # never healthy
        raise AssertionError("not reached")


def test_a_restarted_server_is_not_taken_for_the_pending_scale_outs_server():
    """Before: the restarted server's InstanceAdded ended the pending scale-out, and the
    rule, asked again after every later step, started one more server each time."""
    actor, world, trainer, recorder = fake_actor(
        "disagg-sync", 2, break_after=2, restart=True, iterations=4,
        sets=[f"policies.allocation={scripted_scaling.register_always_add()}"],
    )  # fmt: skip
    servers = actor.faults.servers = StartingServers(world)

    async def after_step(step: int) -> None:  # the push after step 0 takes server 1 back
        while step == 0 and not any(f.event == "restarted" for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(4 * BATCH))  # each sample once
    events = [(f.event, f.instance_id) for f in recorder.faults]
    assert events == [("lost", 1), ("restarted", 1), ("rejoined", 1)]
    assert servers.attempts == 1  # one scale-out, still waiting for its server
    assert sorted(actor.controller.views) == [0, 1]


class SplitServers(FakeServers):
    """Servers for scale-outs of two (2 and 3): ``dies`` of them starts, then its process
    exits before it joins; the other becomes healthy only once ``after`` is in the faults
    (server 3 waits for 2's); any later server never becomes healthy."""

    def __init__(self, world: FakeWorld, recorder, dies: int, after: tuple[str, int]) -> None:
        super().__init__(world, restart=False)
        self.recorder, self.dies, self.after, self.attempts = recorder, dies, after, 0

    async def add(self, instance_id: int) -> ServerSlot:
        self.attempts += 1
        if instance_id > 3:
            await asyncio.Event().wait()
        while instance_id == 3 and self.after not in faults_of(self.recorder):
            await asyncio.sleep(0.01)
        slot = await super().add(instance_id)
        if instance_id == self.dies:
            self.world.dead.add(instance_id)
        return slot


def faults_of(recorder) -> list[tuple[str, int]]:
    return [(f.event, f.instance_id) for f in recorder.faults]


def traced(controller) -> list[tuple]:
    """The controller's scale-outs and how they end, in order, as it handles them."""
    trace: list[tuple] = []
    handle = controller.handle

    def handle_traced(event):
        commands = handle(event)
        if isinstance(event, InstanceAdded):
            trace.append(("added", event.view.instance_id, event.from_scale_out))
        elif isinstance(event, ScaleOutFailed):
            trace.append(("failed", event.reason))
        trace.extend(("scale-out", c.num_instances) for c in commands if isinstance(c, ScaleOut))
        return commands

    controller.handle = handle_traced
    return trace


LOST_3 = "server 3 was lost before it joined (generation server 3 (pid 43) killed by SIGKILL)"
SPLITS = {  # which server dies; what 3 waits for; steps held until; the trace; the faults
    "first-dies": (2, ("lost", 2), {1: ("added", 3)},
                   [("scale-out", 2), ("added", 3, True), ("scale-out", 2)],
                   [("added", 2), ("lost", 2), ("added", 3), ("rejoined", 3)]),
    "last-dies": (3, ("rejoined", 2), {1: ("added", 2), 2: ("lost", 3)},
                  [("scale-out", 2), ("added", 2, False),
                   ("failed", f"added 1 of 2 servers: {LOST_3}"), ("scale-out", 2)],
                  [("added", 2), ("rejoined", 2), ("added", 3), ("lost", 3)]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(SPLITS))
def test_a_scale_out_of_two_servers_ends_once_when_its_last_server_is_settled(case, caplog):
    """Before (first-dies): server 2's loss ended the scale-out (``ScaleOutFailed``) while
    server 3 still started, the controller scaled out again, and 3's join then ended that
    newer scale-out as well: a third scale-out for two. (last-dies): the scale-out ended
    twice, at 2's join and at 3's loss."""
    actor, world, trainer, recorder = fake_actor(
        "disagg-sync", 2, break_after=None, restart=False, iterations=5,
        sets=[f"policies.allocation={scripted_scaling.register_always_add(2)}"],
    )  # fmt: skip
    dies, after, held, trace_then, faults_then = SPLITS[case]
    servers = actor.faults.servers = SplitServers(world, recorder, dies, after)
    trace = traced(actor.controller)

    async def after_step(step: int) -> None:  # each held until a server got so far
        while step in held and held[step] not in faults_of(recorder):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    caplog.set_level("WARNING", logger="runtime.server_faults")
    asyncio.run(run_actor(actor))
    assert sorted(trainer.trained) == list(range(5 * BATCH))  # each sample once
    assert trace == trace_then
    assert faults_of(recorder) == faults_then
    assert servers.attempts == 3  # 2 and 3, then 4 of the next scale-out (never healthy)
    said = [r.getMessage() for r in caplog.records if "elastic scale-out" in r.getMessage()]
    assert said == [f"elastic scale-out {t[1]}" for t in trace if t[0] == "failed"]


def test_a_scale_out_whose_first_server_cannot_start_tries_none_of_the_rest(caplog):
    """Seen on Ray: a scale-out's server that no node could place waited for good; each of
    the rest would wait as long, so the first failure ends the scale-out at once."""
    actor, world, trainer, recorder = fake_actor(
        "disagg-sync", 2, break_after=None, restart=False, iterations=4,
        sets=[f"policies.allocation={scripted_scaling.register_always_add(2)}"],
    )  # fmt: skip
    servers = actor.faults.servers = FailingServers(world, "fails")

    async def after_step(step: int) -> None:  # a scale-out in flight ends before the next
        while servers.attempts > sum(f.event == "add-failed" for f in recorder.faults):
            await asyncio.sleep(0.01)

    actor.after_step = after_step
    caplog.set_level("WARNING", logger="runtime.server_faults")
    asyncio.run(run_actor(actor))
    said = [r.getMessage() for r in caplog.records if "added no server" in r.getMessage()]
    assert len(said) == 3 and servers.attempts == 3  # one server tried a scale-out of two
    assert sorted(trainer.trained) == list(range(4 * BATCH))
