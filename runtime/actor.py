"""The live actor: executes a pipeline-mode controller of ``policies.modes`` with asyncio.

It feeds the controller events stamped with seconds from the run's start and carries
out its commands:

* ``Dispatch`` — one streamed HTTP request per command to that instance's server
  (``/v1/tandem/generate``); each completion is consumed the moment the server streams
  it back (stream generation): reward from the task, then ``SampleFinished``;
* ``TrainSamples`` / ``OptimizerStep`` / ``PushWeights`` — jobs for the trainer process,
  run strictly in order by one trainer task; a step answers ``TrainStepDone``, a push
  answers ``WeightsLoaded`` for every instance;
* ``SwitchContext`` (colocated) — training already waits for generation, so switching to
  training is immediate; switching back loads the new weights on the servers;
* ``Finish`` — stop.

A server that dies is a *lost instance* (:mod:`runtime.server_faults`): the requests it
was running go to the other servers with their own sample ids (``InstanceLost``), its
death is recorded, and with restarts it comes back at the next weight push
(``InstanceAdded``). With no server left the run stops with one line naming the dead
process.

A resumed run (``step_offset`` > 0) drives a fresh controller whose steps, versions and
iterations count from 0; the actor adds the offset to steps and versions at every
boundary, and the recorder maps each sample back to its own iteration.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from policies.modes.base import Controller
from policies.modes.events import (
    Command,
    ContextSwitched,
    Dispatch,
    Event,
    Finish,
    OptimizerStep,
    PushWeights,
    SampleFinished,
    ScaleIn,
    ScaleOut,
    Start,
    SwitchContext,
    TrainSamples,
    TrainStepDone,
    WeightsLoaded,
)
from policies.records import InflightHandling, Request, SpanKind
from policies.resources import TRAINER, generation_resource
from policies.tracking import StepUpdate
from runtime.actor_config import ActorConfig
from runtime.checkpoints import CheckpointCadence
from runtime.gen_client import Generated, GenerationClient, SampleFailed
from runtime.graceful_stop import RunStopped, StopDeadline, StopRequested
from runtime.groups import GroupBook
from runtime.jobs import Failed, JobQueue
from runtime.recorder import Recorder
from runtime.server_faults import Lost, ServerFaults
from runtime.step_checkpoints import StepCheckpoints
from runtime.supervisor import Servers
from runtime.tasks import TaskSet
from runtime.trainer_proc import PushResult, TrainerProcess


class Actor:
    def __init__(
        self,
        config: ActorConfig,
        controller: Controller,
        clients: dict[int, GenerationClient],
        trainer: TrainerProcess,
        tasks: TaskSet,
        priority: Callable[[Request], float],
        recorder: Recorder,
        learn_lengths: Callable[[list[Request], list[int]], None] | None = None,
        servers: Servers | None = None,
        after_step: Callable[[int], Awaitable[None]] | None = None,
        on_step: Callable[[StepUpdate], None] | None = None,
    ) -> None:
        self.config = config
        self.controller = controller
        self.clients = clients
        self.trainer = trainer
        self.tasks = tasks
        self.priority = priority
        self.recorder = recorder
        c = config  # which optimizer steps checkpoint, and how
        cadence = CheckpointCadence(c.checkpoint_every, c.checkpoint_interval_s, c.num_steps)
        self.checkpoints = StepCheckpoints(
            c.checkpoint_path, cadence, c.step_offset, trainer, recorder, self.now
        )
        self.learn_lengths = learn_lengths  # an online length predictor's update, if any
        self.on_step = on_step  # gets a StepUpdate after every optimizer step (tracking)
        self._lengths_seen: tuple[list[Request], list[int]] = ([], [])
        self.groups = GroupBook(config.group_size, config.step_offset)
        self.pauses_s: list[float] = []
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._jobs = JobQueue()
        self._trainer_free = asyncio.Lock()  # held by the job in progress, and by a stop
        self._push_order = asyncio.Lock()  # pushes reach the trainer in command order
        self._idle = asyncio.Event()  # set while no request is running on any server
        self._idle.set()
        self._settled = asyncio.Event()  # no push's answers outstanding (runtime.server_faults)
        self._settled.set()
        self._tasks: set[asyncio.Task] = set()
        self._t0 = self._time_offset_s = 0.0
        self.faults = ServerFaults(self, servers)
        self.after_step = after_step  # awaited after each optimizer step and its checkpoint

    # -- clock and boundaries -----------------------------------------------------------

    def now(self) -> float:
        return time.perf_counter() - self._t0 + self._time_offset_s

    def _global(self, step_or_version: int) -> int:
        return step_or_version + self.config.step_offset

    # -- the loop -------------------------------------------------------------------------

    def start_clock(self, time_offset_s: float = 0.0) -> None:
        """Start the run's clock and checkpoint interval at ``time_offset_s`` (a resumed run's:
        its checkpoint's time), before the initial weight load so that it is on it too."""
        self._t0, self._time_offset_s = time.perf_counter(), time_offset_s
        self.checkpoints.cadence.last_s = time_offset_s

    async def run(self) -> float:
        """Drive the controller to ``Finish``; returns the run's end time (seconds)."""
        if not self._t0:
            self.start_clock()
        self.spawn(self._trainer_loop())
        self.spawn(self.faults.watch())
        self.spawn(self.faults.watch_health())
        try:
            await self._execute(self.controller.handle(Start(self.now())))
            while not self.controller.finished:
                event = await self._events.get()
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, StopRequested):
                    await self._stop(event.deadline)
                if isinstance(event, Lost):
                    await self._execute(await self.faults.handle_lost(event))
                    continue
                await self._execute(self.controller.handle(event))
            return self.now()
        finally:
            for t in list(self._tasks):
                t.cancel()

    def request_stop(self, deadline: StopDeadline | None = None) -> None:
        """Stop the run with its last trained step checkpointed by ``deadline`` (default:
        ``stop_grace_s`` from now; runtime.graceful_stop)."""
        grace_s = self.config.stop_grace_s
        self._events.put_nowait(StopRequested(deadline or StopDeadline.from_now(grace_s)))

    async def _stop(self, deadline: StopDeadline) -> None:
        """Let the trainer's job in progress finish and start no other (the lock is never
        given back); checkpoint the last completed step if the cadence skipped it. Past
        the deadline the run stops without that checkpoint (runtime.graceful_stop)."""
        try:
            await asyncio.wait_for(self._stop_gracefully(), deadline.remaining_s())
        except TimeoutError:
            raise RunStopped(self.checkpoints.out_of_grace(deadline.grace_s)) from None
        raise RunStopped("the run stopped on request, its last trained step checkpointed")

    async def _stop_gracefully(self) -> None:
        await self._trainer_free.acquire()
        await self.checkpoints.at_stop()

    def post(self, event: Any) -> None:
        """Queue an event for the loop (the fault handler's way in)."""
        self._events.put_nowait(event)

    async def _execute(self, commands: list[Command]) -> None:
        for cmd in commands:
            if isinstance(cmd, Dispatch):
                self._dispatch(cmd)
            elif isinstance(cmd, TrainSamples):
                self._jobs.put(lambda c=cmd: self._train(c))
            elif isinstance(cmd, OptimizerStep):
                self._jobs.put(lambda c=cmd: self._step(c))
            elif isinstance(cmd, PushWeights):
                self.spawn(self._push(cmd.version, cmd.inflight))
            elif isinstance(cmd, SwitchContext):
                self._jobs.put(lambda c=cmd: self._switch(c))
            elif isinstance(cmd, ScaleOut):
                self.spawn(self.faults.scale_out(cmd.num_instances))
            elif isinstance(cmd, ScaleIn):
                self.faults.retire(cmd.instance_ids)
            elif isinstance(cmd, Finish):
                return
            else:
                raise ValueError(f"the live runtime cannot execute {type(cmd).__name__}")

    def spawn(self, coro) -> None:
        """Run ``coro`` beside the loop; an error it raises stops the run (``Failed``)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._spawned_done)

    def _spawned_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._events.put_nowait(Failed(task.exception()))

    # -- generation -----------------------------------------------------------------------

    def _dispatch(self, cmd: Dispatch) -> None:
        dispatch_s = self.now()
        for _ in cmd.requests:
            self.recorder.sent(cmd.instance_id, dispatch_s)
        self.faults.sent(cmd.instance_id, cmd.requests)
        self._idle.clear()
        self.spawn(self._generate(cmd.instance_id, cmd.requests, dispatch_s))

    async def _generate(
        self, instance_id: int, requests: tuple[Request, ...], dispatch_s: float, attempt: int = 0
    ) -> None:
        """One streamed request per dispatch; each completion is consumed as it arrives.
        A failed stream goes to :meth:`ServerFaults.stream_failed`: the server lost (its
        requests go elsewhere), or the samples it has not returned sent to it again."""
        priorities = [int(self.priority(r)) for r in requests]
        seeds = [self.config.seed_of(r) for r in requests]
        client = self.clients[instance_id]
        try:
            async for out in client.stream(requests, dispatch_s, self.now, priorities, seeds):
                if self.faults.is_lost(instance_id):
                    return  # its requests were dispatched again
                request = out.completion.request
                self.faults.returned(instance_id, request)
                self.recorder.returned(instance_id, self.now(), self.recorder.iteration(request))
                self.update_idle()
                c = self._finished(out)
                self._events.put_nowait(SampleFinished(c.gen_end_s or self.now(), c))
        except SampleFailed as err:
            if (failure := self.faults.sample_failed(instance_id, err)) is not None:
                self._events.put_nowait(Failed(failure))
        except (httpx.HTTPStatusError, httpx.TransportError) as err:
            again = await self.faults.stream_failed(instance_id, err, requests, attempt)
            if again:
                await self._generate(instance_id, again, dispatch_s, attempt + 1)

    def update_idle(self) -> None:
        """Set while no request runs on any server (before the sample's event: a push
        waiting for the servers to drain reaches the trainer ahead of the jobs this last
        sample will queue)."""
        if not any(self.recorder.outstanding(i) for i in self.clients):
            self._idle.set()

    def _finished(self, out: Generated) -> Any:
        c = out.completion
        c.text = out.text
        c.reward = self.tasks.reward(c.request.prompt_id, out.text)
        self.recorder.completion(c)
        self._learn_length(c.request, c.output_tokens)
        self.groups.finished(c, out.prompt_ids)
        offset = self.config.step_offset  # the controller counts versions from this run's start
        return dataclasses.replace(
            c, version_start=c.version_start - offset, version_end=c.version_end - offset,
            version_prompt=None if c.version_prompt is None else c.version_prompt - offset,
        )  # fmt: skip

    def _learn_length(self, request: Request, output_tokens: int) -> None:
        """Hand finished lengths to an online predictor in batches (its refit runs in a
        background thread: the loop does not wait for it)."""
        if self.learn_lengths is None:
            return
        requests, tokens = self._lengths_seen
        requests.append(request)
        tokens.append(output_tokens)
        if len(requests) >= self.config.length_update_every:
            self._lengths_seen = ([], [])
            self.learn_lengths(requests, tokens)

    # -- training and weights (one job at a time, in command order; pushes go first) -------

    async def _trainer_loop(self) -> None:
        while True:  # a job's error ends the loop and the run (spawn)
            job = await self._jobs.get()
            async with self._trainer_free:
                await job()

    async def _train(self, cmd: TrainSamples) -> None:
        step = self._global(cmd.step)
        await self._run_train(step, self.groups.place(step, cmd.completions))

    async def _run_train(self, step: int, items: list) -> None:
        if not items:
            return
        start = self.now()
        await self.trainer.train(items, start)
        self.recorder.trained([it.sample_id for it in items], step)
        self.recorder.span(
            TRAINER, SpanKind.TRAIN, start, self.now(), iteration=step, batch_size=len(items)
        )

    async def _step(self, cmd: OptimizerStep) -> None:
        step = self._global(cmd.step)
        await self._run_train(step, self.groups.close(step))
        await self._settled.wait()  # the last push's weights are loaded (or pushed again)
        start = self.now()
        stats = await self.trainer.step(step, start)
        entry = dataclasses.asdict(stats)
        self.recorder.steps.append(entry)
        stepped = self.now()
        entry["end_s"] = stepped  # not start + busy_s: its micro-batches ran earlier
        if self.checkpoints.due(step):
            await self.checkpoints.write(step)
        saved = self.now()
        if self.after_step is not None:
            await self.after_step(step)
        end = self.now()
        self.recorder.span(TRAINER, SpanKind.TRAIN, start, end, iteration=step)
        if self.on_step is not None:
            done = dataclasses.replace(stats, end_s=end)
            self.on_step(self.recorder.step_update(done, end, self.config.num_steps))
        # where the step's own time went (policies.breakdown), and where it ended
        entry.update(
            optimizer_s=stepped - start, checkpoint_s=saved - stepped, hooks_s=end - saved,
            report_s=self.now() - end, done_s=self.now(), end_s=end,
        )  # fmt: skip
        local = dataclasses.replace(stats, step=cmd.step, version=cmd.step + 1, end_s=end)
        self._events.put_nowait(TrainStepDone(end, local))

    async def _push(self, local_version: int, inflight: InflightHandling) -> None:
        """Push the weights of ``local_version`` as soon as the servers may take them.

        A push is issued once the step that made its weights is done, so every trainer
        job still queued belongs to a later step: the push goes ahead of them (train
        jobs only accumulate gradients, later steps would change the weights). With
        ``barrier``/``drain`` it first waits for the running requests to finish, outside
        the trainer's queue, which keeps training the samples streaming in meanwhile.
        Only the broadcast holds the queue; the servers' answers (after they load) are read
        while the trainer goes on, and the next optimizer step waits for them."""
        version = self._global(local_version)
        async with self._push_order:
            if inflight != InflightHandling.KEEP:
                await self._idle.wait()
            sent: asyncio.Future[tuple[float, float, list[int]]] = asyncio.Future()

            async def job() -> None:
                self._settled.clear()
                start = self.now()
                members = await self.faults.send(version)
                sent.set_result((start, self.now(), members))

            self._jobs.put_first(job)
            start, end, members = await sent
            try:
                result, members = await self.faults.settle(version, members)
            finally:
                self._settled.set()
            self._note_push(version, result, members, start, end, self.now())
        for i in self.faults.members:
            if not self.faults.is_lost(i):  # a lost one's view is gone (or going)
                self._events.put_nowait(WeightsLoaded(self.now(), i, local_version))

    async def push_now(self, version: int) -> PushResult:
        """Push ``version`` to the group's servers, answers included (runtime.server_faults)."""
        start = self.now()
        result, members = await self.faults.push(version)
        end = self.now()
        self._note_push(version, result, members, start, end, end)
        return result

    def _note_push(
        self, version: int, result: PushResult, members: list[int], start: float, sent: float,
        end: float,
    ) -> None:  # fmt: skip
        """Record a push: the trainer's span (to the broadcast's end), the servers' pauses."""
        self.pauses_s += result.pause_s
        self._note_stages(version, result)
        # a transfer carries the step whose weights it moves (as the simulator's links do)
        step = version - 1 if version > 0 else None
        self.recorder.span(TRAINER, SpanKind.WEIGHT_SYNC, start, sent, iteration=step)
        for i, pause_s in zip(members, result.pause_s):
            self.recorder.span(generation_resource(i), SpanKind.WEIGHT_SYNC, end - pause_s, end)

    def _note_stages(self, version: int, result: PushResult) -> None:
        """Each server's receive / check / load milliseconds of the push that carried a
        step's weights, in that step's entry of ``steps.json``."""
        for entry in reversed(self.recorder.steps):
            if entry["step"] == version - 1:
                entry["push_stages_ms"] = result.stages_ms
                return

    async def _switch(self, cmd: SwitchContext) -> None:
        start = self.now()
        if cmd.to.value == "generate":
            await self.push_now(self._global(self.controller.latest_version))
        self.recorder.span(TRAINER, SpanKind.CONTEXT_SWITCH, start, self.now())
        self._events.put_nowait(ContextSwitched(self.now(), cmd.to))
