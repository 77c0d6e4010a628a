"""The processes of a live run on Ray: each vLLM server and each trainer rank is a Ray actor.

:class:`ServerActor` starts the same server as the local launcher (``runtime.server``,
its routes unchanged) as its own child on the actor's node, bound to the node's address;
the server's whole process group dies with the actor (``PR_SET_PDEATHSIG`` and
:func:`runtime.procs.stop_server`), so when Ray kills an actor nothing it started runs on.
Nor when the actor's node dies: ``ray.kill`` cannot reach an actor whose raylet is gone,
and Ray's worker outlived its raylet (and so did the server), so the actor watches its
raylet and, once it is gone, stops its server and exits (:func:`exit_with_raylet`).
:class:`TrainerRank` is one FSDP2 rank (:class:`runtime.sharded_trainer.ShardedTrainer`)
with the weight-group calls of :class:`runtime.trainer_proc.TrainerWorker`; rank 0 joins
the servers' weight group and broadcasts what every rank gathered.

These classes are plain: :mod:`runtime.ray_launcher` wraps them with ``ray.remote`` and
the resources of their placement-group bundles.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policies.records import StepStats
from runtime.lifetime import (
    ProcessIdentity,
    deaf_to_stop_signals,
    exit_without_finalizing,
    identify,
    when_gone,
)
from runtime.procs import ServerProcess, free_port, start_server, stop_server, wait_healthy
from runtime.trainer import TrainerConfig, TrainItem
from runtime.trainer_proc import PushResult, ServerAddr, TrainerWorker

RAYLET_POLL_S = 0.5  # how often an actor looks whether its raylet still runs

logger = logging.getLogger(__name__)


def node_address() -> str:
    """The address this process's Ray node is reachable at (127.0.0.1 in tests)."""
    import ray

    return ray.util.get_node_ip_address()


def node_id() -> str:
    """The Ray node this process runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


def raylet() -> ProcessIdentity | None:
    """The raylet of this Ray worker (``RAY_RAYLET_PID``, which Ray gives the workers it
    starts; else this process's parent); None if it cannot be seen (no ``/proc``)."""
    pid = os.environ.get("RAY_RAYLET_PID")
    return identify(int(pid) if pid else os.getppid())


def exit_with_raylet(release: Callable[[], None]) -> threading.Thread | None:
    """From now on, when this worker's raylet ends (its node died), ``release`` what the
    actor started and end the worker, within about :data:`RAYLET_POLL_S`. Ray cannot kill
    an actor whose raylet is gone, and its worker was seen to run on without it (in a
    cluster whose killed raylet stayed a zombie, unreaped by the process that started it:
    tests/test_ray_node_death.py). None where the raylet cannot be watched."""
    watched = raylet()
    if watched is None:
        return None

    def exit_now() -> None:
        logger.warning("the raylet (pid %d) of this Ray worker ended: exiting", watched.pid)
        try:
            release()
        finally:
            exit_without_finalizing(1)

    return when_gone(watched, exit_now, RAYLET_POLL_S)


@dataclass(frozen=True, slots=True)
class Placed:
    """Where one process of the run landed: recorded in ``logs/placement.json``."""

    pid: int
    node_id: str
    node_address: str


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What every server of a run is started with (the ``live`` section's settings)."""

    model_dir: str
    token: str
    kv_cache_gib: float
    max_model_len: int
    max_num_seqs: int
    log_dir: str  # on a file system the node can write (shared across nodes, or local)
    startup_timeout_s: float
    api_key: str | None = None
    cores_per_server: int = 1  # engine cores pinned on a CPU node (the pool's tp)
    engine_nice: int = 0  # the engines' niceness (live.engine_nice)


@dataclass(frozen=True, slots=True)
class ServerInfo:
    instance_id: int
    base_url: str
    placed: Placed  # the server's process (its group leader) and its node


class ServerActor:
    """One generation server on this actor's node."""

    def __init__(self, instance_id: int, settings: ServerSettings) -> None:
        self.instance_id = instance_id
        self.settings = settings
        self._server: ServerProcess | None = None
        self._raylet_watch: threading.Thread | None = None

    def start(self) -> ServerInfo:
        """Start the server on a free port of this node; returns once it answers /health.
        Should the node's raylet die from now on, the server is stopped and the actor exits
        (:func:`exit_with_raylet`)."""
        if self._raylet_watch is None:
            self._raylet_watch = exit_with_raylet(self.stop)
        host = node_address()
        server = self._start_healthy(host)
        placed = Placed(server.proc.pid, node_id(), host)
        return ServerInfo(self.instance_id, server.base_url, placed)

    def _start_healthy(self, host: str) -> ServerProcess:
        """Start the server on a free port of ``host`` (``self._server`` from then on, for a
        stop while it starts); returns it once it answers /health."""
        s = self.settings
        self._server = start_server(
            self.instance_id, s.model_dir, host, free_port(host), s.token, self._cores(),
            s.kv_cache_gib, s.max_model_len, s.max_num_seqs, Path(s.log_dir), api_key=s.api_key,
            engine_nice=s.engine_nice,
        )  # fmt: skip
        wait_healthy(self._server, s.startup_timeout_s)
        return self._server

    def _cores(self) -> list[int]:
        """``cores_per_server`` of this node's cores, a different slice per instance."""
        cores = sorted(os.sched_getaffinity(0))
        n = min(self.settings.cores_per_server, len(cores))
        first = (self.instance_id * n) % len(cores)
        return [cores[(first + k) % len(cores)] for k in range(n)]

    def poll(self) -> int | None:
        """The server's exit status (negative: killed by that signal); None while it runs."""
        return None if self._server is None else self._server.proc.poll()

    def log_path(self) -> str:
        return "" if self._server is None else str(self._server.log_path)

    def stop(self) -> None:
        if self._server is not None:
            stop_server(self._server, grace_s=2.0)


# the concurrency group (a thread of its own) in which rank 0 answers a push's
# ``answers_ready`` / ``push_answers`` while a train call runs (runtime.trainer_proc)
ANSWERS_GROUP = "answers"


class TrainerRank:
    """Rank ``rank`` of the sharded trainer; one typed method per trainer call. Wrapped
    with ``ray.remote(concurrency_groups={ANSWERS_GROUP: 1})``: the calls of the default
    group run one at a time, the push answers beside them.

    A rank ignores SIGINT and SIGTERM, as the local trainer process does
    (:func:`runtime.lifetime.deaf_to_stop_signals`; Ray's worker turned SIGTERM into an
    exit): a SIGTERM to every process of the run (a cgroup's: systemd, Slurm's job step)
    is the command's to act on, and does not end the rank before the stop's checkpoint.
    The driver ends it (``ray.kill``) once the stop is done (docs/ray.md); a rank whose
    node's raylet dies ends itself (:func:`exit_with_raylet`)."""

    def __init__(self, config: TrainerConfig, rank: int, world_size: int, device: str) -> None:
        deaf_to_stop_signals()  # the stop's checkpoint is the driver's to ask for
        self._raylet_watch = exit_with_raylet(lambda: None)  # the worker's start: no orphan
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self._worker: TrainerWorker | None = None

    # -- the ranks' own process group ----------------------------------------------------

    def placed(self) -> Placed:
        return Placed(os.getpid(), node_id(), node_address())

    def free_port(self) -> int:
        """A free port on this rank's node (rank 0 hosts the groups there)."""
        return free_port(node_address())

    def init_group(self, host: str, port: int) -> None:
        """Join the ranks' default process group (blocks until every rank has joined)."""
        from runtime.sharded_trainer import ShardedTrainer, init_trainer_group

        backend = "nccl" if self.device == "cuda" else "gloo"
        init_trainer_group(host, port, self.rank, self.world_size, backend)
        trainer = ShardedTrainer(self.config, self.rank, self.world_size, self.device)
        self._worker = TrainerWorker(self.config, trainer)

    # -- collectives: every rank calls these, in the same order ----------------------------

    def initialise(self, checkpoint: str | None) -> Any:
        return self._w.initialise(checkpoint)

    def train(self, items: list[TrainItem], now_s: float) -> float:
        return self._w.train(items, now_s)

    def step(self, step: int, now_s: float) -> StepStats:
        return self._w.step(step, now_s)

    def checkpoint(self, path: str, data: dict[str, Any]) -> None:
        self._w.checkpoint(path, data)

    def gather_weights(self) -> int:
        return self._w.gather_weights()

    def checksums(self) -> dict[str, tuple[float, float]]:
        return self._w.checksums()

    # -- rank 0 only: the servers' weight group ---------------------------------------------

    def join_group(self, servers: list[ServerAddr], port: int, backend: str) -> None:
        """Host the weight group on this node (rank 0) and have every server join it."""
        self._w.join_group(servers, node_address(), port, backend)

    def push_weights(self, version: int) -> PushResult:
        return self._w.push_weights(version)

    def send_weights(self, version: int) -> None:
        self._w.send_weights(version)

    def answers_ready(self) -> bool:
        return self._w.answers_ready()

    def push_answers(self) -> PushResult:
        return self._w.push_answers()

    @property
    def _w(self) -> TrainerWorker:
        if self._worker is None:
            raise RuntimeError(f"trainer rank {self.rank}: init_group was not called")
        return self._worker
