"""The trainer as a separate process, pinned to its own cores, called from the actor.

:class:`TrainerProcess` spawns a child running :func:`_serve_calls`: it owns a
:class:`runtime.trainer.Trainer` and answers one call at a time over a pipe. The child
is also rank 0 of the weight group and drives ``/init_process_group`` and
``/request_weight_update`` on every server (one thread per server, while the main
thread broadcasts). An update states each bucket's sizes and content hash, which the
servers check before loading. A push that fails on some servers reports which
(:attr:`PushResult.failures`) and leaves the group, so that the caller can re-create it
with the servers still alive and push again. The child dies with its parent.

:class:`TrainerWorker` also holds a :class:`runtime.sharded_trainer.ShardedTrainer` (one
worker per rank, e.g. one Ray actor each). Then ``initialise``, ``train``, ``step``,
``checkpoint``, ``checksums`` and :meth:`TrainerWorker.gather_weights` are collectives that
the caller runs on every rank at once; ``join_group`` and ``push_weights`` run on rank 0
only. A push on M ranks is: ``gather_weights()`` on every rank (the full tensors land on
rank 0), then ``push_weights(version)`` on rank 0, which sends what it gathered.

A push has two halves: ``send_weights`` asks every server for the update and starts the
broadcast; ``push_answers`` waits for it and for the servers' answers (each checks and
loads what it received). ``push_weights`` is both. The trainer is free between the two:
it trains the next samples while the backend's threads send and the servers load. The
answers come over a second pipe, served by a thread of the child, so that the actor
learns that the servers hold the new weights while a train call is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing as mp
import os
import signal
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from policies.records import StepStats
from runtime.checkpoints import CheckpointWriter, keep_step, readable
from runtime.core_loan import CoreLoan
from runtime.errors import LiveRunError, ProcessDied, TrainerFailed, describe_exit
from runtime.fan_out import ServerAddr, answers, fan_out, join_unless_refused
from runtime.http_pool import POOL_LIMITS
from runtime.lifetime import die_with_parent, start_deaf_to_stop_signals
from runtime.recorder import DataPosition
from runtime.trainer import Trainer, TrainerConfig, TrainItem, write_state
from runtime.trainer_client import PushResult

JOIN_TIMEOUT_S = 60.0  # every rank must have joined the weight group by then
PUSH_TIMEOUT_S = 30.0  # a server answers an update within this (it receives for 3/4 of it)
ANSWER_POLL_S = 0.002  # how often the actor asks whether the servers answered a push


class TrainerWorker:
    """What runs in the child: the trainer plus the weight-group calls to the servers."""

    def __init__(
        self, config: TrainerConfig, trainer: Trainer | None = None, loan: CoreLoan | None = None
    ) -> None:
        """``trainer``: one already built (a ``ShardedTrainer`` rank); else a ``Trainer``.
        ``loan``: the generation cores, to train on while no request runs."""
        self.trainer = trainer if trainer is not None else Trainer(config)
        self.loan = loan
        self.servers: list[ServerAddr] = []
        self._gathered: list[tuple[str, Any]] | None = None  # by gather_weights, for a push
        self._pending: tuple[int, list[threading.Thread], list] | None = None  # sent, unanswered
        self._sending: list = []  # the broadcast works of the push in flight
        # one pooled client for every control call: a new httpx client costs tens of ms
        # (it builds a TLS context), which would sit on every push's critical path
        self.http = httpx.Client(limits=POOL_LIMITS)
        self.writer = CheckpointWriter()

    def initialise(self, checkpoint: str | None) -> Any:
        self.trainer.initialise()
        position = None
        if checkpoint and readable(Path(checkpoint)) is not None:
            position = self.trainer.load_checkpoint(Path(checkpoint))
        self.trainer.warm_up()  # before the run's clock starts
        if self.loan is not None:  # and on the lent cores' threads (compiled kernels)
            self.loan.warm(self.trainer.warm_up)
            self.trainer.before_micro_batch = self.loan.apply
        return position

    def join_group(self, servers: list[ServerAddr], host: str, port: int, backend: str) -> None:
        self.servers = servers
        world = len(servers) + 1
        bodies = [
            {"master_addr": host, "master_port": port, "rank": i + 1, "world_size": world,
             "backend": backend, "timeout_s": JOIN_TIMEOUT_S, "owner": s.owner}
            for i, s in enumerate(servers)
        ]  # fmt: skip
        # listening before the servers are asked: each gives up on a master that does not
        # answer within seconds (runtime.joining.JOIN_CONNECT_S)
        self.trainer.sender.listen(host, port, world, JOIN_TIMEOUT_S)
        threads, out = fan_out(
            self.http, servers, "/init_process_group", bodies, JOIN_TIMEOUT_S + 30
        )
        join = functools.partial(self.trainer.sender.join, host, port, world, backend)
        join_unless_refused(lambda: join(JOIN_TIMEOUT_S), threads, out, "/init_process_group")

    def gather_weights(self) -> int:
        """Collective on a sharded trainer: gather the full weights onto rank 0 for the
        next :meth:`push_weights`; how many tensors this rank holds (0 but on rank 0)."""
        self._gathered = self.trainer.named_weights()
        return len(self._gathered)

    def push_weights(self, version: int) -> PushResult:
        """Send the weights to every server of the group; a server that fails is named in
        ``failures`` (the group is then left: re-create it before the next push). Uses what
        :meth:`gather_weights` gathered, if it was called since the last push."""
        self.send_weights(version)
        return self.push_answers()

    def send_weights(self, version: int) -> None:
        """Ask every server for the update and start the broadcast (see the module)."""
        if self._pending is not None:
            raise RuntimeError(
                f"weights {version} sent before the answers to {self._pending[0]} were read"
            )
        named, self._gathered = self._gathered, None
        if named is None:
            named = self.trainer.named_weights()
        flats = self.trainer.sender.pack(named)  # before any server pauses
        digests = [asdict(d) for d in self.trainer.sender.digests(named, flats)]
        body = {"version": version, "params": self.trainer.weights_meta(), "buckets": digests,
                "timeout_s": PUSH_TIMEOUT_S}  # fmt: skip
        threads, out = fan_out(
            self.http, self.servers, "/request_weight_update", [body] * len(self.servers),
            PUSH_TIMEOUT_S + 10,
        )  # fmt: skip
        self._pending = (version, threads, out)
        try:  # the broadcast goes on in the backend's threads while the trainer trains
            self._sending = self.trainer.sender.start(flats, PUSH_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no group: the answers say what failed
            self.trainer.sender.leave()

    def _sent(self) -> None:  # waits for the broadcast started by send_weights
        works, self._sending = self._sending, []
        try:
            for work in works:
                work.wait()
        except Exception:  # noqa: BLE001 - a peer died or stalled: its answer says which
            self.trainer.sender.leave()  # closes the group, so the others stop waiting

    def answers_ready(self) -> bool:
        """Have all the servers answered the last :meth:`send_weights`? (does not wait)"""
        if self._pending is None:
            raise RuntimeError("answers_ready without weights sent")
        if all(w.is_completed() for w in self._sending):
            self._sent()  # a failed broadcast closes the group now, not at the answers
        return not any(t.is_alive() for t in self._pending[1])

    def push_answers(self) -> PushResult:
        """Every server's answer to the last :meth:`send_weights` (waits for them)."""
        if self._pending is None:
            raise RuntimeError("push_answers without weights sent")
        (version, threads, out), self._pending = self._pending, None
        self._sent()
        replies = answers(threads, out, "/request_weight_update")
        failures = {i: a for i, a in enumerate(replies) if isinstance(a, str)}
        if failures:
            self.trainer.sender.leave()
        ok = [a if isinstance(a, dict) else {"pause_s": 0.0, "stages_ms": {}} for a in replies]
        return PushResult(
            version, [a["pause_s"] for a in ok], [a["stages_ms"] for a in ok], failures
        )

    def train(self, items: list[TrainItem], now_s: float) -> float:
        return self.trainer.train(items, now_s)

    def step(self, step: int, now_s: float) -> StepStats:
        return self.trainer.step(step, now_s)

    def checkpoint(self, path: str, data: dict[str, Any]) -> None:
        """Write ``path`` (last.pt, or the directory last.dcp of a sharded trainer) and
        keep it as the checkpoint of its step (rank 0 does). The single-process trainer
        copies its state now and writes it in the background (runtime.checkpoints)."""
        step, keep = data["next_step"] - 1, self.trainer.config.keep_checkpoints
        if not self.trainer.snapshots_checkpoints:
            self.trainer.save_checkpoint(Path(path), data)
            if self.trainer.rank == 0:
                keep_step(Path(path), step, keep)
            return
        state = self.trainer.checkpoint_state(data)

        def write() -> None:
            write_state(Path(path), state)
            keep_step(Path(path), step, keep)

        self.writer.submit(write)

    def close(self) -> None:  # waits for the checkpoint being written
        self.writer.close()

    def checksums(self) -> dict[str, tuple[float, float]]:
        """Per-tensor checksums of the weights (a sharded trainer: collective; rank 0's
        answer is the full one, the others' empty)."""
        from runtime.weight_sync import tensor_checksum

        return {n: tensor_checksum(t) for n, t in self.trainer.named_weights()}


_CALLS = (
    "initialise", "join_group", "push_weights", "send_weights", "answers_ready", "push_answers",
    "train", "step", "checkpoint", "checksums",
)  # fmt: skip
# answered on a second pipe by a thread of their own while the main thread trains (on the
# main pipe they waited for the micro-batch in training, ~0.2 s; docs/live-throughput.md)
_ANSWER_CALLS = ("answers_ready", "push_answers")


def _answer(conn, worker: TrainerWorker, names: tuple[str, ...]) -> bool:
    """Run one call from ``conn``; False once the caller asked to stop."""
    msg = conn.recv()
    if msg is None:
        return False
    name, args = msg
    try:
        assert name in names, name
        conn.send((True, getattr(worker, name)(*args)))
    except LiveRunError as err:  # says what went wrong and what to do: one line, no trace
        conn.send((None, str(err)))
    except Exception as err:
        conn.send((False, f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))
    return True


def _serve_answers(conn, worker: TrainerWorker) -> None:
    with contextlib.suppress(EOFError, OSError):
        while _answer(conn, worker, _ANSWER_CALLS):
            pass


def _serve_calls(
    conn, answers_conn, config: TrainerConfig, cores: list[int] | None, nice: int,
    parent_pid: int, loan: CoreLoan | None,
) -> None:  # fmt: skip
    die_with_parent(signal.SIGKILL, parent_pid)  # a killed launcher leaves no trainer
    if cores:
        os.sched_setaffinity(0, cores)
    os.nice(nice)  # 0: as it is
    worker = TrainerWorker(config, loan=loan)
    serve(conn, answers_conn, worker)
    worker.close()  # the last checkpoint is complete before the process ends


def serve(conn, answers_conn, worker: TrainerWorker) -> None:
    """Answer ``worker``'s calls from ``conn`` until it sends None, and its push answers
    from ``answers_conn`` on a thread of their own meanwhile."""
    threading.Thread(target=_serve_answers, args=(answers_conn, worker), daemon=True).start()
    while _answer(conn, worker, _CALLS):
        pass


class TrainerProcess:
    """Client of the trainer child process: one typed async method per
    :class:`TrainerWorker` method, each awaited without blocking the loop (the pipe and
    the method's name stay inside this class)."""

    def __init__(
        self, config: TrainerConfig, cores: list[int] | None = None, nice: int = 0,
        loan: CoreLoan | None = None,
    ) -> None:  # fmt: skip
        self.config = config
        self.cores = cores
        self.nice = nice
        self.loan = loan
        self._proc: mp.process.BaseProcess | None = None
        self._conn = None
        self._answers_conn = None  # push answers, read while a call runs on the main pipe
        self._lock = asyncio.Lock()
        self._answers_lock = asyncio.Lock()
        # the pipe calls' threads: not asyncio's default pool, which the loop's end waits
        # for, so that a stop out of grace (live.stop_grace_s) does not wait for a call
        self._pool = ThreadPoolExecutor(2, "trainer-pipe")

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        answers_parent, answers_child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve_calls,
            args=(child, answers_child, self.config, self.cores, self.nice, os.getpid(), self.loan),
            daemon=True,
        )
        start_deaf_to_stop_signals(self._proc)  # the run stops it, after the stop's checkpoint
        self._conn, self._answers_conn = parent, answers_parent

    # -- the trainer's methods, each run in the child, one at a time -----------------------

    async def initialise(self, checkpoint: str | None) -> DataPosition | None:
        """Load the model (and ``checkpoint`` if it exists); its data position, if any."""
        data = await self._call("initialise", checkpoint)
        return None if data is None else DataPosition.from_dict(data)

    async def join_group(
        self, servers: list[ServerAddr], host: str, port: int, backend: str
    ) -> None:
        await self._call("join_group", servers, host, port, backend)

    async def push_weights(self, version: int) -> PushResult:
        return await self._call("push_weights", version)

    async def send_weights(self, version: int) -> None:
        """Ask the servers for the update and broadcast; the answers: :meth:`push_answers`."""
        await self._call("send_weights", version)

    async def push_answers(self) -> PushResult:
        """The servers' answers, read on the child's second pipe while a train call runs
        on the first; asked every few milliseconds whether they are in rather than waiting
        inside the child, so that a stopping run is not held by a slow server."""
        while not await self._answers_call("answers_ready"):
            await asyncio.sleep(ANSWER_POLL_S)
        return await self._answers_call("push_answers")

    async def train(self, items: list[TrainItem], now_s: float) -> float:
        """Forward and backward over ``items`` into the current step; the loss."""
        return await self._call("train", items, now_s)

    def generation_idle(self, idle: bool) -> None:
        """Whether any request runs on a server: while none does, the child trains on the
        generation cores too (``runtime.core_loan``), if it was lent them."""
        if self.loan is not None:
            self.loan.generation_idle(idle)

    async def step(self, step: int, now_s: float) -> StepStats:
        return await self._call("step", step, now_s)

    async def checkpoint(self, path: str, position: DataPosition) -> None:
        await self._call("checkpoint", path, position.to_dict())

    async def checksums(self) -> dict[str, tuple[float, float]]:
        return await self._call("checksums")

    async def _call(self, name: str, *args: Any) -> Any:
        async with self._lock:
            return await self._in_pool(self._conn, name, *args)

    async def _answers_call(self, name: str) -> Any:
        async with self._answers_lock:
            return await self._in_pool(self._answers_conn, name)

    async def _in_pool(self, conn, name: str, *args: Any) -> Any:
        call = functools.partial(self._call_sync, conn, name, *args)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def _call_sync(self, conn, name: str, *args: Any) -> Any:
        try:
            conn.send((name, args))
            ok, value = conn.recv()
        except (EOFError, OSError):  # the child is gone: say how it died
            self._proc.join(timeout=5)
            raise ProcessDied(
                f"trainer process (pid {self._proc.pid}) {describe_exit(self._proc.exitcode)} "
                f"during {name}"
            ) from None
        if ok is None:
            raise LiveRunError(value)
        if not ok:  # one line; the child's traceback goes to the run's log
            logging.getLogger(__name__).info("trainer %s failed:\n%s", name, value)
            raise TrainerFailed(f"trainer {name} failed: {value.splitlines()[0]}")
        return value

    def stop(self, grace_s: float = 10.0) -> None:
        """Ask the child to end, give it ``grace_s`` to finish its call and the checkpoint
        it writes in the background (live.stop_grace_s), then SIGKILL it."""
        self._pool.shutdown(wait=False)
        if self._proc is None:
            return
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conn.send(None)
        self._proc.join(timeout=grace_s)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._proc = None
