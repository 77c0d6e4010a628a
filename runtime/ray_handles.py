"""The driver's side of the Ray actors: servers and trainer ranks as the actor loop sees them.

:class:`RayServers` is :class:`runtime.supervisor.Servers` for servers that are Ray
actors: a server is lost when its process exits or its actor dies (probed without
blocking the event loop), it is stopped by stopping its process group and killing its
actor, and restarted (or added, for elastic scale-out) as a new actor on a placement
group bundle. :class:`RayTrainerGroup` has :class:`runtime.trainer_proc.TrainerProcess`'s
async methods over M :class:`runtime.ray_actors.TrainerRank` actors: collectives go to
every rank, the weight group is rank 0's, and a rank that dies is named.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from policies.records import StepStats
from runtime.errors import LiveRunError, ProcessDied, describe_exit
from runtime.ray_actors import ANSWERS_GROUP, Placed, ServerInfo
from runtime.recorder import DataPosition
from runtime.supervisor import Servers, ServerSlot
from runtime.trainer import TrainItem
from runtime.trainer_proc import ANSWER_POLL_S, PushResult, ServerAddr

STOP_TIMEOUT_S = 20.0

# instance id -> a new, not yet started ServerActor handle (placed first, for an instance
# the spec does not place: elastic scale-out)
MakeServer = Callable[[int], Awaitable[Any]]


# Ray's message about a dead actor: ids (``class_name: …``, ``actor_id: …``) and, after
# the reason, advice that is the same for every death; neither says what happened
_RAY_ID_FIELDS = ("class_name:", "actor_id:", "pid:", "namespace:", "ip:")
_RAY_BOILERPLATE = "Some common causes include"
MAX_REASON_CHARS = 300


def _one_line(err: BaseException) -> str:
    """What Ray says happened, on one line: its reason lines without the actor's ids and
    the generic advice after them, cut at :data:`MAX_REASON_CHARS`."""
    text = str(err).split(_RAY_BOILERPLATE, 1)[0]
    lines = [ln.strip() for ln in text.splitlines()]
    kept = [ln for ln in lines if ln and not ln.startswith(_RAY_ID_FIELDS)]
    text = " ".join(" ".join(kept).split()).rstrip(" .") + "."
    return text[:MAX_REASON_CHARS] + ("…" if len(text) > MAX_REASON_CHARS else "")


def actor_exception(err: BaseException) -> str:
    """The exception an actor's method raised (a ``RayTaskError`` wraps it with Ray's
    traceback), as ``Type: message`` on one line."""
    cause = getattr(err, "cause", None)
    if not isinstance(cause, BaseException):
        return _one_line(err)
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text}"[:MAX_REASON_CHARS]


class RayServers(Servers):
    """The run's servers as Ray actors (``make``: a new actor for an instance id)."""

    def __init__(
        self, planned: list[int], token: str, make: MakeServer, restarts: bool,
        startup_timeout_s: float,
    ) -> None:  # fmt: skip
        super().__init__([], token, None, startup_timeout_s)
        self.planned = planned  # the instance ids the spec places
        self._make = make
        self._restarts = restarts
        self.actors: dict[int, Any] = {}
        self.infos: dict[int, ServerInfo] = {}
        self._probes: dict[int, Any] = {}
        self._exits: dict[int, str] = {}

    @property
    def can_restart(self) -> bool:
        return self._restarts

    @property
    def can_add(self) -> bool:
        return True

    async def add(self, instance_id: int) -> ServerSlot:
        """Start server ``instance_id`` as a new actor; returns once it is healthy."""
        actor = await self._make(instance_id)
        self.actors[instance_id] = actor
        self.infos.pop(instance_id, None)  # healthy again only once this start returns
        try:
            info: ServerInfo = await actor.start.remote()
        except Exception as err:
            raise ProcessDied(
                f"generation server {instance_id} (Ray actor) failed to start: {_one_line(err)}"
            ) from None
        self.infos[instance_id] = info
        self._exits.pop(instance_id, None)
        self._probes.pop(instance_id, None)
        slot = ServerSlot(instance_id, info.base_url)
        self.slots[instance_id] = slot
        return slot

    def placements(self) -> dict[str, Placed]:
        return {f"server-{i}": info.placed for i, info in self.infos.items()}

    def describe(self, instance_id: int) -> str:
        info = self.infos.get(instance_id)
        if info is None:
            return f"generation server {instance_id} (Ray actor)"
        return (
            f"generation server {instance_id} (Ray actor on {info.placed.node_address}, "
            f"pid {info.placed.pid}, {info.base_url})"
        )

    def exited(self, instance_id: int) -> bool:
        """Has the server's process exited or its actor died? Never blocks: a probe is sent
        and read on a later call."""
        import ray

        if instance_id in self._exits:
            return True
        actor = self.actors.get(instance_id)
        probe = self._probes.get(instance_id)
        if actor is None:
            return False
        if probe is None:
            self._probes[instance_id] = actor.poll.remote()
            return False
        ready, _ = ray.wait([probe], timeout=0)
        if not ready:
            return False
        del self._probes[instance_id]
        try:
            status = ray.get(probe)
        except Exception as err:  # the actor (or its node) died
            self._exits[instance_id] = f"lost with its Ray actor ({_one_line(err)})"
            return True
        if status is None:
            return False
        self._exits[instance_id] = describe_exit(status)
        return True

    def _exit(self, slot: ServerSlot) -> str:
        return self._exits.get(slot.instance_id, "exited")

    def stop(self, instance_id: int) -> None:
        """Stop the server's process group, then kill its actor. An actor still starting
        is killed at once: it runs one call at a time, so its ``stop`` would wait behind
        ``start`` (~20 s of a Ctrl-C); its server dies with it (parent-death signal)."""
        import ray

        actor = self.actors.pop(instance_id, None)
        if actor is None:
            return
        if instance_id in self.infos:
            with contextlib.suppress(Exception):
                ray.get(actor.stop.remote(), timeout=STOP_TIMEOUT_S)
        with contextlib.suppress(Exception):
            ray.kill(actor)

    def stop_all(self) -> None:
        for i in list(self.actors):
            self.stop(i)

    async def restart(self, instance_id: int) -> ServerSlot:
        self.stop(instance_id)
        return await self.add(instance_id)


class RayTrainerGroup:
    """The trainer's M ranks, called like :class:`runtime.trainer_proc.TrainerProcess`."""

    def __init__(self, ranks: list[Any]) -> None:
        self.ranks = ranks
        self._placed: list[Placed] = []
        self._lock = asyncio.Lock()
        self._running: set[Any] = set()  # calls not ended (one given up on stays here)

    async def start(self) -> None:
        """Form the ranks' process group, hosted by rank 0 on its node."""
        self._placed = list(await asyncio.gather(*(r.placed.remote() for r in self.ranks)))
        host, port = self._placed[0].node_address, await self.ranks[0].free_port.remote()
        await self._all("joining the process group", lambda r: r.init_group.remote(host, port))

    @property
    def pid(self) -> int | None:
        return self._placed[0].pid if self._placed else None

    def placements(self) -> dict[str, Placed]:
        return {f"trainer-{k}": placed for k, placed in enumerate(self._placed)}

    async def initialise(self, checkpoint: str | None) -> DataPosition | None:
        data = (await self._all("initialise", lambda r: r.initialise.remote(checkpoint)))[0]
        return None if data is None else DataPosition.from_dict(data)

    async def join_group(
        self, servers: list[ServerAddr], host: str, port: int, backend: str
    ) -> None:
        """The weight group is hosted by rank 0 on its own node (``host``/``port`` of the
        caller's machine do not apply there): rank 0 picks a free port on it."""
        free = await self._one(0, "free_port", self.ranks[0].free_port.remote())
        await self._one(0, "join_group", self.ranks[0].join_group.remote(servers, free, backend))

    async def push_weights(self, version: int) -> PushResult:
        await self.send_weights(version)
        return await self.push_answers()

    async def send_weights(self, version: int) -> None:
        """Gather the full weights on rank 0 (a collective), which broadcasts them."""
        await self._all("gather_weights", lambda r: r.gather_weights.remote())
        await self._one(0, "send_weights", self.ranks[0].send_weights.remote(version))

    async def push_answers(self) -> PushResult:
        """Polled, as ``TrainerProcess.push_answers``, in rank 0's answers group: read while
        a train call runs there (not behind this group's lock either)."""

        def ask(name: str) -> Awaitable[Any]:
            method = getattr(self.ranks[0], name)
            return method.options(concurrency_group=ANSWERS_GROUP).remote()

        while not await self._await(0, "answers_ready", ask("answers_ready")):
            await asyncio.sleep(ANSWER_POLL_S)
        return await self._await(0, "push_answers", ask("push_answers"))

    async def train(self, items: list[TrainItem], now_s: float) -> float:
        return (await self._all("train", lambda r: r.train.remote(items, now_s)))[0]

    def generation_idle(self, idle: bool) -> None:
        """Nothing: the ranks hold resources of their own, none lent by the servers."""

    async def step(self, step: int, now_s: float) -> StepStats:
        return (await self._all("step", lambda r: r.step.remote(step, now_s)))[0]

    async def checkpoint(self, path: str, position: DataPosition) -> None:
        data = position.to_dict()
        await self._all("checkpoint", lambda r: r.checkpoint.remote(path, data))

    async def checksums(self) -> dict[str, tuple[float, float]]:
        return (await self._all("checksums", lambda r: r.checksums.remote()))[0]

    def stop(self, grace_s: float = 0.0) -> None:
        """Give the ranks' calls in progress ``grace_s`` to end (a stop's checkpoint: the
        launcher passes what is left of the stop's deadline), then kill every rank."""
        import ray

        if self._running and grace_s > 0:
            with contextlib.suppress(Exception):
                ray.wait(list(self._running), num_returns=len(self._running), timeout=grace_s)
        for r in self.ranks:
            with contextlib.suppress(Exception):
                ray.kill(r)

    async def _all(self, what: str, call: Callable[[Any], Awaitable[Any]]) -> list[Any]:
        """``call`` on every rank at once (a collective); rank order."""
        async with self._lock:
            refs = [call(r) for r in self.ranks]
            return list(
                await asyncio.gather(*(self._await(k, what, ref) for k, ref in enumerate(refs)))
            )

    async def _one(self, rank: int, what: str, ref: Awaitable[Any]) -> Any:
        async with self._lock:
            return await self._await(rank, what, ref)

    async def _await(self, rank: int, what: str, ref: Awaitable[Any]) -> Any:
        """The call's result; a call given up on (cancelled) stays in ``_running``."""
        from ray.exceptions import RayActorError

        self._running.add(ref)
        try:
            result = await ref
        except RayActorError as err:
            self._running.discard(ref)
            pid = self._placed[rank].pid if rank < len(self._placed) else "?"
            raise ProcessDied(
                f"trainer rank {rank} (Ray actor, pid {pid}) died during {what}: {_one_line(err)}"
            ) from None
        except Exception as err:  # the rank's own exception: one line, no Ray traceback
            self._running.discard(ref)
            raise LiveRunError(
                f"trainer rank {rank} {what} failed: {actor_exception(err)}"
            ) from None
        self._running.discard(ref)
        return result
