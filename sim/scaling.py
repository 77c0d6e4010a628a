"""Elastic generation in the simulator: the executor's side of ``ScaleOut`` / ``ScaleIn``.

Modelling assumptions: an added instance serves after ``sim.instance_start_s`` (engine
start and weight load) holding the controller's latest weights as of the moment it is
ready, read then and not at ``ScaleOut``: a push made while it starts does not reach it,
so weights read earlier would leave it behind for good (and a sync batch, which waits for
every instance to hold the new weights, would wait forever). A retired one stops the
moment the last request it was running finishes (nothing is dropped or moved), and takes
no further weight pushes. Its GPUs are paid for from the ``ScaleOut`` (its start
included) to its retirement (``sim.gpu_cost``), and over that same time it counts in the
generation utilisation and the bubbles (its start as waiting). Known bias: weights pushed
while an instance starts cost it no transfer of its own (its start covers one load)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import simpy

from policies.build import instance_view
from policies.cluster import GenerationPool
from policies.modes.events import Event, InstanceAdded, InstanceRetired
from sim.ticks import to_seconds, to_ticks


class ScalingWorld(Protocol):
    """What scaling uses of the simulation (``sim.simulator._World``)."""

    env: simpy.Environment
    instances: dict[int, Any]  # instance id -> _Instance (engine, pool, lease, retiring)

    def emit(self, event: Event) -> None: ...


def scale_out(
    world: ScalingWorld,
    count: int,
    start_s: float,
    pool: GenerationPool,
    latest_version: Callable[[], int],
    add: Callable[[GenerationPool, int], Any],
    kv_capacity: Callable[[Any], int],
):  # noqa: ANN201 - SimPy process
    """Add ``count`` instances of ``pool`` after ``start_s``, each announced once ready and
    holding ``latest_version()`` as of then (every later push reaches it); the last one's
    ``InstanceAdded`` ends the scale-out (``from_scale_out``)."""
    yield world.env.timeout(to_ticks(start_s))
    for k in range(count):
        inst = add(pool, latest_version())
        view = instance_view(inst.engine.config.instance_id, pool, kv_capacity, inst.engine.version)
        last = k == count - 1
        world.emit(InstanceAdded(to_seconds(world.env.now), view, from_scale_out=last))


def retire(world: ScalingWorld, instance_ids: tuple[int, ...]) -> None:
    """Mark instances retiring; each is retired once it has nothing left to run."""
    for i in instance_ids:
        world.instances[i].retiring = True
        retire_if_drained(world, i)


def retire_if_drained(world: ScalingWorld, instance_id: int) -> None:
    """(An engine's busy hook, and at ``ScaleIn``): a retiring instance without running
    or waiting requests is retired now."""
    inst = world.instances[instance_id]
    if not inst.retiring or inst.retired_s is not None:
        return
    scheduler = inst.engine.scheduler
    if scheduler.num_running or scheduler.num_waiting:
        return
    inst.retired_s = to_seconds(world.env.now)
    world.emit(InstanceRetired(inst.retired_s, instance_id))
