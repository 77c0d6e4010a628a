"""The trainer ranks of a run on Ray stop as the local trainer process does
(runtime.graceful_stop): they ignore SIGTERM and Ctrl-C, which are the command's to act on,
and the teardown gives a rank's call in progress (a stop's checkpoint) what is left of the
stop's deadline before it kills the ranks. On a local Ray bound to 127.0.0.1; no vLLM, no
torch process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import pytest
from proc_view import alive, wait_until

from runtime.ray_actors import ANSWERS_GROUP, TrainerRank
from runtime.ray_handles import RayTrainerGroup

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_node():
    """A Ray instance for the module, started as ``tandem run --live --ray`` starts one."""
    import ray

    from runtime.ray_session import start_local_ray

    start_local_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def test_a_trainer_rank_ignores_sigterm_and_ctrl_c_and_is_still_killed_at_the_end(ray_node):
    """Before: Ray's worker turned SIGTERM into an exit, so a SIGTERM to every process of
    the run (a cgroup's: systemd, Slurm's job step) ended the ranks before the stop's
    checkpoint; the local trainer process ignores it (runtime.lifetime)."""
    actor = ray_node.remote(concurrency_groups={ANSWERS_GROUP: 1})(TrainerRank)  # as launched
    rank = actor.options(num_cpus=0).remote(None, 0, 1, "cpu")
    pid = ray_node.get(rank.placed.remote(), timeout=120).pid
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    died = wait_until(lambda: not alive(pid), 5)
    assert not died, "the trainer rank ended on SIGTERM or SIGINT"
    assert ray_node.get(rank.placed.remote(), timeout=30).pid == pid  # it still answers
    RayTrainerGroup([rank]).stop()
    assert wait_until(lambda: not alive(pid), 60), "the driver's stop did not end the rank"


def test_the_teardown_gives_a_ranks_call_in_progress_what_is_left_of_the_grace(ray_node, tmp_path):
    """Before: the ranks were killed at once, a stop's checkpoint being written torn with
    time left of live.stop_grace_s (a local trainer process gets that time)."""

    class Checkpointing:  # a rank writing its checkpoint: it ends after `seconds`
        def write(self, path: str, seconds: float) -> bool:
            time.sleep(seconds)
            Path(path).write_text("written")
            return True

    rank = ray_node.remote(Checkpointing).options(num_cpus=0).remote()
    group = RayTrainerGroup([rank])
    path = tmp_path / "checkpoint"

    async def give_up_on_the_call() -> None:  # as a second Ctrl-C unwinds the actor loop
        call = group._one(0, "checkpoint", rank.write.remote(str(path), 2.0))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(call, 0.2)

    asyncio.run(give_up_on_the_call())
    assert not path.exists()  # still being written when the teardown starts
    group.stop(60.0)  # what is left of the stop's deadline
    assert path.read_text() == "written"
