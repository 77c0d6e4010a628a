"""A lost generation server costs the run nothing: what the actor does when one dies.

:class:`ServerFaults` tracks, per server, the requests dispatched to it and not yet
returned, and which servers form the weight group. A server is marked lost the moment
its stream breaks, a push finds it dead, its ``/health`` says its engine stalled or died
while it holds requests, or (for servers this run started) its process exits; the loss
reaches the actor's loop as a :class:`Lost` event, in order with the samples that server
returned before it died, and becomes the controller's ``InstanceLost``: its unreturned
requests go to the other servers with the same sample ids (a returned sample is never
sent again, so none is trained twice). Its process group is killed, the event is logged
and recorded (``faults.json``), and with ``live.restart_servers`` it is started again,
joins the weight group at the next push and is back as ``InstanceAdded`` (answering no
scale-out). With no server left the run stops with :class:`ServersLost`. How a scale-out
ends, exactly once, whatever becomes of its servers: :mod:`runtime.scale_outs`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import httpx

from policies.modes.base import Controller
from policies.modes.events import (
    Command,
    InstanceAdded,
    InstanceLost,
    InstanceRetired,
    ScaleOutFailed,
)
from policies.records import InstanceView, Request
from runtime.errors import LiveRunError, ProcessDied
from runtime.gen_client import ENGINE_DEAD, GenerationClient
from runtime.jobs import Failed
from runtime.procs import free_port
from runtime.recorder import Fault, Recorder
from runtime.scale_outs import ScaleOuts
from runtime.supervisor import Servers
from runtime.trainer_proc import PushResult, TrainerProcess

log = logging.getLogger(__name__)

MAX_PUSH_ATTEMPTS = 3  # a push that finds dead servers goes again without them
MAX_RESTARTS = 3  # per server and run
MAX_STREAM_RETRIES = 2  # per dispatch, to a server that still answers /health
HEALTH_PERIOD_S = 5.0  # how often a server with requests on it is asked /health


class State(StrEnum):
    SERVING = "serving"  # takes requests; in the weight group (from the next push, if new)
    LOST = "lost"  # dead: takes nothing, left out of the next weight group
    REJOINING = "rejoining"  # restarted or added, healthy: joins the group at the next push
    STARTING = "starting"  # added (scale-out), its engine starting: not in the group yet
    RETIRING = "retiring"  # asked to retire: finishes what it runs, takes nothing new
    RETIRED = "retired"  # drained and stopped: left out of the next weight group


IN_GROUP = (State.SERVING, State.REJOINING, State.RETIRING)  # a weight push reaches these


class ServersLost(ProcessDied):
    """Every generation server of the run is gone; the message names the last one."""


@dataclass(frozen=True, slots=True)
class Lost:
    """A server is lost (queued for the actor's loop, in order with its samples)."""

    instance_id: int
    cause: str
    description: str | None = None  # how it died, if already known


class ActorPort(Protocol):
    """What the fault handler uses of :class:`runtime.actor.Actor`, its owner."""

    clients: dict[int, GenerationClient]
    controller: Controller
    recorder: Recorder
    trainer: TrainerProcess
    config: Any  # runtime.actor.ActorConfig: step_offset, weight_host, weight_backend

    def now(self) -> float: ...
    def post(self, event: Any) -> None: ...
    def spawn(self, coro: Any) -> None: ...
    def update_idle(self) -> None: ...


class ServerFaults:
    def __init__(
        self, actor: ActorPort, servers: Servers | None, health_period_s: float = HEALTH_PERIOD_S
    ) -> None:
        self.actor = actor
        self.servers = servers
        self.health_period_s = health_period_s
        self.members: list[int] = sorted(actor.clients)  # the weight group (joined at start)
        self._group_stale = False  # a member died: the group must be made again
        self._state = {i: State.SERVING for i in actor.clients}
        self._inflight: dict[int, dict[int, Request]] = {}  # instance -> sample id -> request
        self._views: dict[int, InstanceView] = {}  # instance -> its view when it was lost
        self._restarts: dict[int, int] = {}
        self._scale_outs = ScaleOuts(self._scale_out_failed)  # which one a new server ends

    # -- bookkeeping, called by the actor ---------------------------------------------------

    def sent(self, instance_id: int, requests: tuple[Request, ...]) -> None:
        running = self._inflight.setdefault(instance_id, {})
        running.update((r.sample_id, r) for r in requests)

    def returned(self, instance_id: int, request: Request) -> None:
        self._inflight.get(instance_id, {}).pop(request.sample_id, None)

    def is_lost(self, instance_id: int) -> bool:
        """True unless the server is serving or retiring (nothing more is taken from it)."""
        return self._state[instance_id] not in (State.SERVING, State.RETIRING)

    def mark_lost(self, instance_id: int, cause: str, description: str | None = None) -> None:
        """From now on nothing more is taken from this server; the loop handles the rest."""
        if self._state[instance_id] == State.LOST:
            return
        self._state[instance_id] = State.LOST
        self._group_stale = True
        self.actor.post(Lost(instance_id, cause, description))

    def sample_failed(self, instance_id: int, err: Exception) -> LiveRunError | None:
        """A sample's error line from ``instance_id``: the run's error, or None where it is
        the server's loss: a server already lost (its requests went elsewhere; stopping it
        fails what it still held), or one whose engine died, now marked lost."""
        if self.is_lost(instance_id):
            return None
        if ENGINE_DEAD in str(err):
            self.mark_lost(instance_id, str(err))
            return None
        return LiveRunError(str(err))

    async def stream_failed(
        self, instance_id: int, err: httpx.HTTPError, requests: tuple[Request, ...], attempt: int
    ) -> tuple[Request, ...]:
        """A dispatch's stream to ``instance_id`` failed; returns what to send it again.

        A refusal (4xx) fails the run, naming the server. A broken connection to a server
        that still answers ``/health`` (one it closed just as the client reused it, say)
        gets the dispatch's unreturned samples sent again, on a new connection, up to
        ``MAX_STREAM_RETRIES`` times. Anything else marks the server lost."""
        if isinstance(err, httpx.HTTPStatusError) and err.response.status_code < 500:
            message = f"generation server {instance_id} refused a dispatch: {err}"
            self.actor.post(Failed(LiveRunError(message)))
            return ()
        cause = f"{type(err).__name__}: {err}"
        retry = isinstance(err, httpx.TransportError) and attempt < MAX_STREAM_RETRIES
        description = None
        if retry and not self.is_lost(instance_id):
            description = await self._confirm(instance_id, cause)
            if description is None and not self.is_lost(instance_id):
                running = self._inflight.get(instance_id, {})
                again = tuple(r for r in requests if r.sample_id in running)
                detail = f"its stream broke ({cause}); it answers /health: sent again"
                log.warning("generation server %d: %s (%d samples)",
                            instance_id, detail, len(again))  # fmt: skip
                fault = Fault(self.actor.now(), instance_id, "retried", detail, len(again))
                self.actor.recorder.fault(fault)
                return again
        self.mark_lost(instance_id, cause, description)
        return ()

    async def watch(self, period_s: float = 0.5) -> None:
        """Notice a server process that exits, even one with nothing running on it."""
        if self.servers is None:
            return
        while True:
            for i, state in list(self._state.items()):
                watched = state not in (State.LOST, State.STARTING, State.RETIRED)
                if watched and self.servers.exited(i):
                    self.mark_lost(i, "its process exited")
            await asyncio.sleep(period_s)

    async def watch_health(self) -> None:
        """Notice a server whose engine hangs with requests on it (``/health`` 503: stalled,
        dead or stuck) without waiting for its stream's read timeout."""
        while True:
            await asyncio.sleep(self.health_period_s)
            busy = [i for i, running in self._inflight.items() if running and not self.is_lost(i)]
            for i in busy:
                if (says := await self.actor.clients[i].unwell()) is None:
                    continue
                cause = f"it {says}"
                description = await self._confirm(i, cause)  # not a passing stall
                if description is not None and not self.is_lost(i):
                    self.mark_lost(i, cause, description)

    # -- a loss, in the actor's loop -----------------------------------------------------

    async def handle_lost(self, event: Lost) -> list[Command]:
        i, actor = event.instance_id, self.actor
        description = event.description or await self._confirm(i, event.cause)
        if description is None:
            raise LiveRunError(
                f"generation server {i}'s stream broke ({event.cause}) although it still "
                "answers /health; stopping the run"
            )
        if self.servers is not None:
            self.servers.stop(i)  # its whole process group: nothing it started runs on
        requests = tuple(self._inflight.pop(i, {}).values())
        now = actor.now()
        actor.recorder.lost(i, now, requests[0].iteration if requests else None)
        actor.recorder.fault(Fault(now, i, "lost", description, len(requests)))
        if not any(state in (State.SERVING, State.RETIRING) for state in self._state.values()):
            raise ServersLost(description)
        log.warning("generation server %d lost: %s; %d unreturned samples go to the others",
                    i, description, len(requests))  # fmt: skip
        if i in actor.controller.views:
            self._views[i] = actor.controller.views[i]
        commands = actor.controller.handle(InstanceLost(now, i, requests))
        actor.update_idle()
        if self._may_restart(i):
            actor.spawn(self._restart(i))
        else:  # a scale-out's server not yet joined is not added
            self._scale_outs.lost(i, f"server {i} was lost before it joined ({description})")
        return commands

    def _may_restart(self, instance_id: int) -> bool:
        if self.servers is None or not self.servers.can_restart:
            return False  # (a scale-out's server not yet joined is then not added)
        self._restarts[instance_id] = self._restarts.get(instance_id, 0) + 1
        return self._restarts[instance_id] <= MAX_RESTARTS

    async def _confirm(self, instance_id: int, cause: str) -> str | None:
        if self.servers is None:
            return f"generation server {instance_id} failed: {cause}"
        return await self.servers.confirm_lost(instance_id, cause)

    async def _restart(self, instance_id: int) -> None:
        actor = self.actor
        assert self.servers is not None
        try:
            slot = await self.servers.restart(instance_id)
        except Exception as err:  # noqa: BLE001 - the run goes on without it
            detail = " ".join(str(err).split())[:500]
            actor.recorder.fault(Fault(actor.now(), instance_id, "restart-failed", detail))
            why = f"server {instance_id} was lost before it joined and its restart failed"
            self._scale_outs.lost(instance_id, f"{why} ({detail})")
            return
        old = actor.clients[instance_id]
        actor.clients[instance_id] = old.reconnected(slot.base_url)
        await old.aclose()
        detail = (
            f"{self.servers.describe(instance_id)} healthy; joins the weight group at the next push"
        )
        actor.recorder.fault(Fault(actor.now(), instance_id, "restarted", detail))
        if self._state[instance_id] == State.LOST:
            self._state[instance_id] = State.REJOINING

    # -- weight pushes -------------------------------------------------------------------

    async def push(self, version: int) -> tuple[PushResult, list[int]]:
        """Push to the group's servers (re-creating the group when they changed); servers a
        push finds dead are marked lost and the push goes again without them."""
        failures: dict[int, str] = {}
        for _ in range(MAX_PUSH_ATTEMPTS):
            members = await self._send_once(version)
            if members is None:
                continue  # a server died while the group was made: again without it
            result = await self.actor.trainer.push_answers()
            if not result.failures:
                self._welcome(version)
                return result, members
            failures = {members[k]: reason for k, reason in result.failures.items()}
            await self._lose_failed(members, result)
        raise LiveRunError(f"weight push of version {version} failed: {failures}")

    async def send(self, version: int) -> list[int]:
        """The first half of a push: the weights broadcast to the group's servers (the group
        re-created when they changed); the members. :meth:`settle` reads their answers."""
        for _ in range(MAX_PUSH_ATTEMPTS):
            members = await self._send_once(version)
            if members is not None:
                return members
        raise LiveRunError(f"weight push of version {version}: the weight group could not be made")

    async def settle(self, version: int, members: list[int]) -> tuple[PushResult, list[int]]:
        """The answers to :meth:`send`; where servers failed, those found dead are marked
        lost and the whole push goes again (:meth:`push`) with the others."""
        result = await self.actor.trainer.push_answers()
        if not result.failures:
            self._welcome(version)
            return result, members
        await self._lose_failed(members, result)
        return await self.push(version)

    async def _send_once(self, version: int) -> list[int] | None:
        members = sorted(i for i, s in self._state.items() if s in IN_GROUP)
        if not members:
            raise ServersLost(f"no generation server left to take weights {version}")
        if (self._group_stale or members != self.members) and not await self._rejoin(members):
            return None
        await self.actor.trainer.send_weights(version)
        return members

    async def _rejoin(self, members: list[int]) -> bool:
        """Make the weight group of ``members``; False if one of them turned out dead."""
        assert self.servers is not None, "the weight group changes only with servers known"
        addrs = [self.servers.addr(i) for i in members]
        config = self.actor.config
        try:
            await self.actor.trainer.join_group(
                addrs, config.weight_host, free_port(config.weight_host), config.weight_backend
            )
        except Exception as err:
            dead = [(i, d) for i in members if (d := await self._confirm(i, str(err))) is not None]
            if not dead:
                raise
            for i, description in dead:
                self.mark_lost(i, "it died while the weight group was made", description)
            return False
        self.members, self._group_stale = members, False
        return True

    async def _lose_failed(self, members: list[int], result: PushResult) -> None:
        """Mark the failed servers that are dead as lost (alive ones just go again); the
        trainer left the group, so the next attempt re-creates it."""
        self._group_stale = True
        for index, reason in result.failures.items():
            description = await self._confirm(members[index], reason)
            if description is not None:
                self.mark_lost(members[index], reason, description)

    # -- elastic generation (the controller's ScaleOut / ScaleIn) ---------------------------

    async def scale_out(self, count: int) -> None:
        """Start ``count`` new servers, each to join at the next push (``InstanceAdded``);
        the last settled, or the first that fails to start, ends it (runtime.scale_outs)."""
        actor = self.actor
        if self.servers is None or not self.servers.can_add:
            why = "added no server: the run attached to its servers (live.server_urls)"
            return self._scale_out_failed(why)
        track = self._scale_outs.begin(count)
        for n in range(count):
            i = max(self._state) + 1
            self._state[i] = State.STARTING
            try:
                slot = await self.servers.add(i)
            except Exception as err:  # noqa: BLE001 - the run goes on without it
                detail = " ".join(str(err).split())[:500]
                actor.recorder.fault(Fault(actor.now(), i, "add-failed", detail))
                self._state[i] = State.LOST
                for _ in range(count - n):  # it, and the rest untried: they would fare alike
                    self._scale_outs.gave_up(track, f"server {i} did not start ({detail})")
                return
            template = next(iter(actor.controller.views.values()))
            self._views[i] = dataclasses.replace(template, instance_id=i)
            actor.clients[i] = next(iter(actor.clients.values())).for_instance(i, slot.base_url)
            detail = f"{self.servers.describe(i)} healthy; joins the weight group at the next push"
            actor.recorder.fault(Fault(actor.now(), i, "added", detail))
            self._state[i] = State.REJOINING
            self._scale_outs.started(track, i)

    def _scale_out_failed(self, reason: str) -> None:
        """A scale-out ended without its last server: the controller must not wait for it."""
        log.warning("elastic scale-out %s", reason)
        self.actor.post(ScaleOutFailed(self.actor.now(), reason))

    def retire(self, instance_ids: tuple[int, ...]) -> None:
        """Stop each server once the requests it runs have come back (``InstanceRetired``);
        it leaves the weight group at the next push."""
        for i in instance_ids:
            if self._state.get(i) == State.SERVING:
                self._state[i] = State.RETIRING
                self.actor.spawn(self._retire_when_drained(i))

    async def _retire_when_drained(self, instance_id: int, period_s: float = 0.05) -> None:
        while self._inflight.get(instance_id) and self._state[instance_id] == State.RETIRING:
            await asyncio.sleep(period_s)
        if self._state[instance_id] != State.RETIRING:
            return  # lost meanwhile: handled as a loss
        self._state[instance_id] = State.RETIRED
        self._group_stale = True
        if self.servers is not None:
            await asyncio.to_thread(self.servers.stop, instance_id)
        actor = self.actor
        actor.recorder.fault(Fault(actor.now(), instance_id, "retired", "drained and stopped"))
        actor.post(InstanceRetired(actor.now(), instance_id))

    def _welcome(self, version: int) -> None:
        """Servers restarted or added serve the version just pushed (a restart: no scale-out)."""
        local = version - self.actor.config.step_offset
        joined = [i for i in self.members if self._state[i] == State.REJOINING]
        for i in joined:
            self._state[i] = State.SERVING
            view = dataclasses.replace(
                self._views.pop(i), num_assigned=0, assigned_tokens=0.0, version=local
            )
            now = self.actor.now()
            self.actor.recorder.fault(Fault(now, i, "rejoined", "serving again", version=version))
            self.actor.post(InstanceAdded(now, view, from_scale_out=self._scale_outs.joined(i)))
