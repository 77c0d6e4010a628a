"""Running a simulation to its end, and saying why when it cannot get there.

``env.run(until=done)`` answers a run whose events run out before ``done`` with SimPy's
generic ``RuntimeError`` ("No scheduled events left"), which names no cause. A run stalls
that way when some process waits for an event that nothing will ever cause (a barrier
waiting for weights no push will bring, say): :func:`run_until_done` processes the same
events in the same order as ``env.run(until=done)`` and raises :class:`SimulationStalled`
instead, with what the run was waiting on.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import simpy
from simpy.core import EmptySchedule

from policies.records import StepStats
from sim.ticks import to_seconds


class SimulationStalled(RuntimeError):
    """No simulated event is left, yet the run has not finished: the message says how far
    it got and what it was waiting for."""


class StalledWorld(Protocol):
    """What the stall report reads of a simulation (``sim.simulator._World``)."""

    env: simpy.Environment
    steps: list[StepStats]
    completions: dict[int, Any]  # sample id -> Completion
    instances: dict[int, Any]  # instance id -> _Instance (engine, retiring, retired_s)
    controller: Any  # policies.modes.base.Controller: views, retiring, latest_version


def run_until_done(env: simpy.Environment, done: simpy.Event, why: Callable[[], str]) -> None:
    """Process events until ``done`` has been processed, as ``env.run(until=done)`` does;
    if the events run out first, raise :class:`SimulationStalled` with ``why()``."""
    try:
        while not done.processed:
            env.step()
    except EmptySchedule:
        raise SimulationStalled(why()) from None


def stall_report(world: StalledWorld, num_steps: int, batch_size: int) -> str:
    """Where a stalled run stands: steps, samples, and each instance's weights and work."""
    controller = world.controller
    latest = controller.latest_version
    lines = [
        f"the simulation stalled at {to_seconds(world.env.now):.6g} s: no event is left, yet "
        f"only {len(world.steps)} of {num_steps} optimizer steps are done "
        f"({len(world.completions)} of {num_steps * batch_size} samples generated); "
        f"the controller ({type(controller).__name__}) holds weights version {latest}",
    ]
    for i, inst in sorted(world.instances.items()):
        lines.append("  " + _instance_line(i, inst, controller, latest))
    return "\n".join(lines)


def _instance_line(instance_id: int, inst: Any, controller: Any, latest: int) -> str:
    engine = inst.engine
    view = controller.views.get(instance_id) or controller.retiring.get(instance_id)
    state = "retired" if inst.retired_s is not None else "retiring" if inst.retiring else "serving"
    line = (
        f"instance {instance_id} ({state}): weights version {engine.version}, "
        f"{engine.scheduler.num_running} running, {engine.scheduler.num_waiting} waiting"
    )
    if view is not None:
        line += f"; the controller sees version {view.version}, {view.num_assigned} assigned"
    if state == "serving" and engine.version < latest:
        line += f" (behind the controller's version {latest})"
    return line


@contextlib.contextmanager
def few_collections(threshold: int = 100_000) -> Iterator[None]:
    """Run with the cyclic garbage collector's first threshold raised (restored after): a
    simulation allocates many short-lived records among many long-lived ones, and the
    default threshold (700) spends a quarter of a large run traversing the long-lived."""
    before = gc.get_threshold()
    gc.set_threshold(max(threshold, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
