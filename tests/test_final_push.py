"""Servers a run attaches to (``live.server_urls``) end on the run's final weights.

The mode controllers (shared with the simulator) finish on the last step without a push;
the live run pushes that step's weights to attached servers after its clock has stopped,
unrecorded, so the run's figures stay those of its timed steps. Fakes of
``tests/server_fakes.py``: no real servers or trainer.
"""

from __future__ import annotations

import asyncio

import pytest
from server_fakes import BATCH, CONFIG, FakeClient, FakeServers, FakeTrainer, FakeWorld

from policies.spec import load_spec
from runtime.live_run import _run_clocked, make_actor
from runtime.recorder import Recorder

ITERATIONS = 3
URL = "live.server_urls=[http://127.0.0.1:8701]"


def _run(mode: str, *sets: str) -> tuple[FakeWorld, Recorder, float]:
    spec = load_spec(
        CONFIG,
        [f"pipeline.mode={mode}", f"run.iterations={ITERATIONS}", f"algorithm.batch_size={BATCH}",
         "live.num_servers=1", *sets],
    )  # fmt: skip
    world, recorder = FakeWorld(1), Recorder()
    trainer = FakeTrainer(world)
    actor = make_actor(spec, {0: FakeClient(0, world)}, trainer, recorder, set(), 0, None,
                       None, None, "gloo")  # fmt: skip
    actor.faults.servers = FakeServers(world, restart=False)
    actor.start_clock()
    run = _run_clocked(spec, actor, trainer, actor.faults.servers, 0, host_cpu=False)
    end_s, _ = asyncio.run(asyncio.wait_for(run, 30))
    return world, recorder, end_s


@pytest.mark.parametrize("mode", ["disagg-sync", "stream-async", "pipeline", "colocated-sync"])
def test_attached_servers_end_on_the_last_steps_weights_off_the_runs_clock(mode):
    world, recorder, end_s = _run(mode, URL)
    assert world.served[0] == ITERATIONS  # the last step's weights, not the ones before
    assert [st["step"] for st in recorder.steps] == list(range(ITERATIONS))
    assert max(s.end_s for s in recorder.spans) <= end_s  # the final push is not recorded


def test_servers_the_run_started_are_not_pushed_the_weights_nothing_serves():
    world, _, _ = _run("disagg-sync")
    assert world.served[0] == ITERATIONS - 1
