"""The run's generation servers as the actor sees them: alive or lost, why, and restarts.

:class:`Servers` knows each server's address and, for servers this run started, its
process: a server is *lost* when its process exited (named with its exit signal), or,
for a server the run attached to (``live.server_urls``), when it stops answering
``/health``. A lost server's whole process group is killed (nothing it started runs on),
and with ``live.restart_servers`` it is started again on its port; it rejoins the weight
group at the next push (:class:`runtime.actor.Actor`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from runtime.errors import describe_exit
from runtime.procs import ServerProcess, describe_server, health_says, stop_server, wait_healthy
from runtime.trainer_proc import ServerAddr

HEALTH_PROBES = 3  # failed /health probes, 0.5 s apart, before a server counts as lost


@dataclass(slots=True)
class ServerSlot:
    instance_id: int
    base_url: str
    process: ServerProcess | None = None  # None: a server the run attached to


class Servers:
    """Generation servers of one run; ``start(i)`` starts server ``i``'s process (a new
    one for elastic scale-out, or again after a loss when ``restarts``)."""

    def __init__(
        self, slots: list[ServerSlot], token: str | None,
        start: Callable[[int], ServerProcess] | None = None, startup_timeout_s: float = 300.0,
        restarts: bool = False, owner: str | None = None,
    ) -> None:  # fmt: skip
        self.slots = {s.instance_id: s for s in slots}
        self.token = token
        self.owner = owner  # the run's id, which it joins the servers with (runtime.lease)
        self._start = start  # None: servers the run attached to (none can be started)
        self._restarts = restarts
        self.startup_timeout_s = startup_timeout_s

    @property
    def can_restart(self) -> bool:
        return self._restarts and self.can_add

    @property
    def can_add(self) -> bool:
        return self._start is not None

    def addr(self, instance_id: int) -> ServerAddr:
        return ServerAddr(self.slots[instance_id].base_url, self.token, self.owner)

    def describe(self, instance_id: int) -> str:
        slot = self.slots[instance_id]
        if slot.process is None:
            return f"generation server {instance_id} ({slot.base_url})"
        return describe_server(slot.process)

    def exited(self, instance_id: int) -> bool:
        """Has the process of a server this run started exited (no network involved)?"""
        process = self.slots[instance_id].process
        return process is not None and process.proc.poll() is not None

    async def confirm_lost(self, instance_id: int, cause: str) -> str | None:
        """Why server ``instance_id`` is lost (one line), or None if it is alive and well."""
        slot = self.slots[instance_id]
        if self.exited(instance_id):
            return f"{self.describe(instance_id)} {self._exit(slot)}"
        why = "stopped answering /health"
        for probe in range(HEALTH_PROBES):
            why = await self._unhealthy(slot.base_url)
            if why is None:
                return None
            if self.exited(instance_id):
                return f"{self.describe(instance_id)} {self._exit(slot)}"
            if probe + 1 < HEALTH_PROBES:
                await asyncio.sleep(0.5)
        return f"{self.describe(instance_id)} {why} ({cause})"

    def _exit(self, slot: ServerSlot) -> str:
        assert slot.process is not None
        how = describe_exit(slot.process.proc.poll())
        return f"{how} (log: {slot.process.log_path})"

    @staticmethod
    async def _unhealthy(base_url: str) -> str | None:
        """None if the server answers ``/health`` 200, else why not (its status: a stuck,
        dead or stalled engine, runtime.control)."""
        try:
            async with httpx.AsyncClient(timeout=2.0) as http:
                health = await http.get(base_url + "/health")
        except httpx.HTTPError:
            return "stopped answering /health"
        return health_says(health)

    def stop(self, instance_id: int) -> None:
        """Kill the server's whole process group (its engine processes too)."""
        process = self.slots[instance_id].process
        if process is not None:
            stop_server(process, grace_s=2.0)

    def stop_all(self) -> None:
        for i in self.slots:
            self.stop(i)

    async def restart(self, instance_id: int) -> ServerSlot:
        """Start server ``instance_id`` again on its port; returns once it is healthy."""
        self.stop(instance_id)
        return await self.add(instance_id)

    async def add(self, instance_id: int) -> ServerSlot:
        """Start server ``instance_id``; returns once it is healthy.

        The process starts from the event loop's thread (the run's main thread): its
        parent-death signal follows the thread that started it."""
        assert self._start is not None, "only servers this run started can be added"
        process = self._start(instance_id)
        slot = ServerSlot(instance_id, process.base_url, process)
        self.slots[instance_id] = slot
        await asyncio.to_thread(wait_healthy, process, self.startup_timeout_s)
        return slot
