"""The actors of a Ray node that dies leave nothing running. In a user trial a node's
raylet died and that node's vLLM server ran on after the run: ``ray.kill`` cannot reach
an actor whose raylet is gone, and Ray's worker ran on without its raylet, so the
server's parent-death signal never came. The actor now watches its raylet
(runtime.ray_actors.exit_with_raylet).

Two Ray nodes on 127.0.0.1, the test process their driver; on the second a
:class:`ServerActor` whose server is a stand-in (no vLLM): a process group whose leader
dies with the actor, as the real server does, and whose other process does not, so that
only the actor's stop of the whole group ends it; and a trainer rank. Then the second
node's raylet is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from proc_view import alive, wait_until

from runtime.lifetime import die_with_parent
from runtime.procs import ServerProcess
from runtime.ray_actors import ANSWERS_GROUP, ServerActor, ServerSettings, TrainerRank
from runtime.ray_session import loopback_stays_loopback

pytestmark = pytest.mark.timeout(300)


def stand_in_server() -> type[ServerActor]:
    """A :class:`ServerActor` whose server is ``sh`` (dying with the actor, as
    ``runtime.procs.start_server`` starts the real one) leading a process group with a
    ``sleep`` below it that outlives its parent; the group's pids are written to
    ``<log_dir>/stand-in.pids``. Made here, so that Ray sends the class itself to its
    worker (which cannot import this test module)."""

    class StandInServer(ServerActor):
        def _start_healthy(self, host: str) -> ServerProcess:
            actor_pid = os.getpid()
            proc = subprocess.Popen(
                ["sh", "-c", 'sleep 600 & echo "$$ $!" > stand-in.pids; wait'],
                cwd=self.settings.log_dir,
                process_group=0,
                preexec_fn=lambda: die_with_parent(signal.SIGKILL, actor_pid),
            )
            log_path = Path(self.settings.log_dir) / "stand-in.log"
            self._server = ServerProcess(self.instance_id, f"http://{host}:1", proc, log_path)
            return self._server

        def pid(self) -> int:
            return os.getpid()

    return StandInServer


def _settings(log_dir: Path) -> ServerSettings:
    return ServerSettings("no-model", "token", 1.0, 64, 1, str(log_dir), startup_timeout_s=1.0)


def _pids(path: Path) -> list[int]:
    """The stand-in group's pids, once its leader has written both."""
    assert wait_until(lambda: path.exists() and len(path.read_text().split()) == 2, 30)
    return [int(p) for p in path.read_text().split()]


@pytest.fixture
def two_nodes():
    """Two Ray nodes on 127.0.0.1 (the second with resource ``second``), connected."""
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "node_ip_address": "127.0.0.1"}
    with loopback_stays_loopback(True):
        cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
        second = cluster.add_node(**node, resources={"second": 1})
        ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield ray, second
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_the_actors_of_a_node_whose_raylet_dies_exit_leaving_no_server(two_nodes, tmp_path):
    ray, second = two_nodes
    on_second = {"resources": {"second": 0.5}, "num_cpus": 0}
    server = ray.remote(stand_in_server()).options(**on_second).remote(0, _settings(tmp_path))
    rank_class = ray.remote(concurrency_groups={ANSWERS_GROUP: 1})(TrainerRank)  # as launched
    rank = rank_class.options(**on_second).remote(None, 0, 1, "cpu")
    ray.get(server.start.remote(), timeout=120)
    running = [
        ray.get(server.pid.remote(), timeout=30),
        *_pids(tmp_path / "stand-in.pids"),
        ray.get(rank.placed.remote(), timeout=120).pid,
    ]
    try:
        assert all(alive(p) for p in running)
        os.kill(second.all_processes["raylet"][0].process.pid, signal.SIGKILL)
        gone = wait_until(lambda: not any(alive(p) for p in running), 30)
        assert gone, f"still running after their raylet died: {[p for p in running if alive(p)]}"
    finally:
        for pid in filter(alive, running):  # what the old code left behind
            os.kill(pid, signal.SIGKILL)
