"""One live run, whatever started its processes: the actor loop over a trainer and servers.

:func:`drive` is what both launchers run once their processes are up — the local one
(:mod:`runtime.launcher`: processes on this machine) and the Ray one
(:mod:`runtime.ray_launcher`: Ray actors across nodes): it loads the trainer (and its
checkpoint), joins the weight group (and keeps the servers' leases while it runs:
:mod:`runtime.lease_keeper`), loads the trainer's weights on every server, drives
the spec's pipeline-mode controller with the :class:`runtime.actor.Actor`, and saves the
:class:`RunResult`. A run directory holding a checkpoint resumes after its last
checkpointed step: trained samples come from the checkpoint, every other sample is
generated again with its own sample id (:class:`ResumablePrompts`), so none is lost or
trained twice in any mode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path

from policies.build import ExecutorInputs, RunPolicies, build_policies, instance_views, mode_of
from policies.logs import NOTICE
from policies.modes.base import PromptSource
from policies.protocols import LengthPredictor, OnlineLengthPredictor
from policies.records import Request
from policies.resources import generation_resource
from policies.results import RunResult, compute_metrics
from policies.rng import RngStreams
from policies.spec import RunSpec
from policies.tracking import StepUpdate
from runtime.actor import Actor, ActorConfig
from runtime.attach import inference_key
from runtime.cost import live_cost_model
from runtime.cpu_rows_file import CpuRowsFile
from runtime.cpu_timeline import CpuTimeline, OnRow
from runtime.gen_client import GenerationClient
from runtime.graceful_stop import StopRequests
from runtime.history import resume_position
from runtime.host_cpu import cpu_use_metrics, process_age_s, run_cpu_by_role, run_pids_by_role
from runtime.lease_keeper import start_keeping, stop_keeping
from runtime.procs import free_port
from runtime.recorder import Recorder
from runtime.run_dir import RunDir
from runtime.supervisor import Servers
from runtime.tasks import TaskPromptSource, TaskSet, task_set
from runtime.trainer import TrainerConfig
from runtime.trainer_client import TrainerClient
from runtime.warm_up import warm_up_servers

log = logging.getLogger(__name__)

AfterStep = Callable[[int], Awaitable[None]]
OnStep = Callable[[StepUpdate], None]


class ResumablePrompts:
    """The controller's prompt source, resumable after any checkpointed step.

    Visits the iterations of ``source`` in order, skips the samples already trained
    (``trained_ids``, from the checkpoint) and hands out the rest ``batch_size`` at a
    time; local batch ``i`` is relabelled iteration ``i`` (a resumed controller counts
    from 0) and ``iteration_of`` keeps each sample's own iteration for the records. A
    fresh run (nothing trained) gets exactly ``source``'s batches. Trained samples are
    whole groups (every mode trains a group in one step), so batches stay group-aligned;
    in ``pipeline`` mode, groups of earlier iterations that were generated but not yet
    trained when the run stopped come first, then the later ones.
    """

    def __init__(self, source: TaskPromptSource, trained_ids: set[int]) -> None:
        self.source = source
        self.trained_ids = trained_ids
        self.iteration_of: dict[int, int] = {}  # sample id -> its global iteration
        self._next_global = 0
        self._queue: deque[Request] = deque()

    def batch(self, iteration: int) -> list[Request]:
        while len(self._queue) < self.source.batch_size:
            fresh = self.source.batch(self._next_global)
            self._queue.extend(r for r in fresh if r.sample_id not in self.trained_ids)
            self._next_global += 1
        out = []
        for _ in range(self.source.batch_size):
            r = self._queue.popleft()
            self.iteration_of[r.sample_id] = r.iteration
            out.append(dataclasses.replace(r, iteration=iteration))
        return out


def model_dir_for(spec: RunSpec) -> str:
    if spec.model.path:
        return spec.model.path
    from runtime.model import ensure_tiny_model

    return str(ensure_tiny_model(spec.run.seed))


def live_device(spec: RunSpec) -> str:
    """``cuda`` or ``cpu``: ``live.device``, with ``auto`` resolved on this machine."""
    if spec.live.device != "auto":
        return spec.live.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def weight_backend(spec: RunSpec, own_gpus: bool) -> str:
    """The weight group's backend: ``live.weight_backend``, with ``auto`` resolved.

    ``own_gpus``: the launcher gives the trainer and each server GPUs of their own (Ray
    bundles). NCCL refuses a group with two ranks on one GPU ("Duplicate GPU detected"),
    which is what servers started on this machine beside a CUDA trainer are; gloo then
    carries the push through host memory into the servers' CUDA buffers."""
    chosen, device = spec.live.weight_backend, live_device(spec)
    if chosen == "nccl" and device != "cuda":
        raise ValueError(f"live.weight_backend: nccl needs live.device cuda, not {device}")
    if chosen != "auto":
        return chosen
    return "nccl" if device == "cuda" and own_gpus and not spec.live.server_urls else "gloo"


def trainer_config(spec: RunSpec, model_dir: str) -> TrainerConfig:
    """The trainer's settings from a spec (shared with the profiler)."""
    a = spec.algorithm
    return TrainerConfig(
        model_dir=model_dir, batch_size=a.batch_size, algorithm=a.name,
        learning_rate=a.learning_rate, clip_epsilon=a.clip_epsilon, kl_coef=a.kl_coef,
        seed=spec.run.seed, num_threads=spec.live.trainer_threads or 0,
        micro_batch_samples=spec.live.micro_batch_samples,
        keep_checkpoints=spec.live.keep_checkpoints, device=live_device(spec),
        compile=spec.live.compile_trainer, skip_zero_advantage=spec.live.skip_zero_advantage,
        share_prompts=spec.live.share_prompts,
    )  # fmt: skip


async def drive(
    spec: RunSpec, run_dir: RunDir, trainer: TrainerClient, servers: Servers,
    length_predictor, after_step: AfterStep | None, on_step, own_gpus: bool = False,
    host_cpu: bool = True, stops: StopRequests | None = None,
) -> RunResult:  # fmt: skip
    """``own_gpus``: the launcher gave the trainer and each server GPUs of their own.
    ``host_cpu``: the run's processes are this process's children, so its CPU use by role
    is measured (not on Ray: its actors are the raylet's, on any node). ``stops``: the
    stop signals the actor loop takes while it runs (runtime.graceful_stop)."""
    ckpt = run_dir.checkpoint
    recorder, trained_ids, offset, time_offset_s = await _start_position(
        trainer, ckpt, spec.run.iterations
    )
    recorder.on_fault = run_dir.append_fault  # faults.json is current during the run
    recorder.on_generation_idle = trainer.generation_idle  # it may borrow the idle cores
    ids = sorted(servers.slots)
    backend = weight_backend(spec, own_gpus)
    host = spec.live.host
    log.info("joining the weight group (%s) with %d server(s)", backend, len(ids))
    await trainer.join_group([servers.addr(i) for i in ids], host, free_port(host), backend)
    clients = _clients(spec, servers, ids)
    keeper = start_keeping(lambda: _urls(servers), servers.token, servers.owner)
    try:
        end_s = time_offset_s
        startup: dict[str, float] = {}
        cpu_rows: list[dict[str, float]] = []
        if spec.run.iterations - offset > 0:
            log.info("warming the servers up")
            startup["warm_up_s"] = await warm_up_servers(clients, spec)
            actor = make_actor(
                spec, clients, trainer, recorder, trained_ids, offset, str(ckpt), length_predictor,
                on_step, backend,
            )  # fmt: skip
            actor.faults.servers, actor.after_step = servers, after_step
            startup["startup_s"] = process_age_s()  # the process's start to the clock's
            cpu_before = _cpu(trainer, servers) if host_cpu else {}
            actor.start_clock(time_offset_s)
            cpu_file = run_dir.cpu_rows_file(offset, time_offset_s) if host_cpu else None
            end_s, cpu_rows = await _run_clocked(
                spec, actor, trainer, servers, offset, host_cpu, cpu_file, stops
            )
            cpu_after = _cpu(trainer, servers) if host_cpu else {}
            startup.update(
                _part_metrics(recorder, offset, time_offset_s, end_s, cpu_before, cpu_after)
            )
    finally:
        await stop_keeping(keeper)
        for c in clients.values():
            await c.aclose()
    result = _result(spec, recorder, end_s, len(ids))
    _save(result, run_dir, offset, time_offset_s, cpu_rows, startup)
    if stops is not None:  # finished: a stop signal now only ends the shutdown
        stops.results_saved()
    log.info("live run done: %.1f s, results in %s", end_s, run_dir.path)
    return result


def _urls(servers: Servers) -> list[str]:
    return [s.base_url for s in servers.slots.values()]


def _clients(spec: RunSpec, servers: Servers, ids: list[int]) -> dict[int, GenerationClient]:
    """A generation client per server, by instance id."""
    from runtime.model import has_task_tokenizer

    key, chars = inference_key(spec.live), has_task_tokenizer(model_dir_for(spec))
    return {
        i: GenerationClient(i, servers.slots[i].base_url, spec.live.temperature, key, chars)
        for i in ids
    }


async def _start_position(
    trainer: TrainerClient, ckpt: Path, num_steps: int
) -> tuple[Recorder, set[int], int, float]:
    """Where the run starts, once the trainer has loaded the model: after the checkpoint's
    step if there is one (its recorder, trained sample ids, next step, clock), else at 0.
    A resume says so on the console (of ``num_steps``, the run's steps)."""
    log.info("trainer loading the model%s", " and its checkpoint" if ckpt.exists() else "")
    position = resume_position(ckpt, await trainer.initialise(str(ckpt)))
    if position is None:
        return Recorder(), set(), 0, 0.0
    step = position.next_step - 1
    log.info("resuming after step %d of %d from %s", step, num_steps, ckpt, extra=NOTICE)
    trained_ids = {s.sample_id for s in position.samples}
    return Recorder.resumed(position), trained_ids, position.next_step, position.time_s


def _save(
    result: RunResult, run_dir: RunDir, offset: int, time_offset_s: float,
    cpu_rows: list[dict[str, float]], startup: dict[str, float],
) -> None:  # fmt: skip
    """Write the run's results, keeping what its earlier parts (if resumed) saved."""
    earlier = run_dir.earlier_part(offset, time_offset_s)  # before this part's save
    result.cpu_timeline = earlier.cpu_rows + cpu_rows
    lost = [f for f in run_dir.faults() if f["event"] == "lost"]
    result.metrics["num_servers_lost"] = len(lost)  # over every part of a resumed run
    result.metrics.update(startup)  # this part of the run (the last, if it was resumed)
    result.save(run_dir.path, write_spec=False)  # spec.yaml stays the run's original
    run_dir.keep_earlier(earlier)


async def _run_clocked(
    spec: RunSpec, actor: Actor, trainer: TrainerClient, servers: Servers, offset: int,
    host_cpu: bool = True, cpu_file: CpuRowsFile | None = None,
    stops: StopRequests | None = None,
) -> tuple[float, list[dict[str, float]]]:  # fmt: skip
    """Load the trainer's weights on the servers and run, on the clock the actor started;
    the run's end time and its CPU timeline (none without ``host_cpu``), whose rows go to
    ``cpu_file`` as they come: a part stopped before its end, by SIGKILL too, leaves them
    to the part that resumes it. While the actor runs, ``stops`` makes SIGTERM and Ctrl-C
    checkpoint its last trained step first (runtime.graceful_stop)."""
    on_row = cpu_file.append if cpu_file is not None else None
    timeline = _cpu_timeline(spec, trainer, servers, actor.now, on_row) if host_cpu else None
    try:
        log.info("loading the trainer's weights on the servers")
        await actor.push_now(offset)  # the servers serve the trainer's weights
        log.info("running %d iterations of %s", spec.run.iterations - offset, spec.pipeline.mode)
        with stops.listening(actor.request_stop) if stops else contextlib.nullcontext():
            end_s = await actor.run()
    finally:
        cpu_rows = timeline.stop() if timeline else []
        if cpu_file is not None:
            cpu_file.close()
    if spec.live.server_urls:
        await push_final_weights(actor)
    return end_s, cpu_rows


async def push_final_weights(actor: Actor) -> None:
    """Load the last step's weights on the servers, after the run's clock has stopped.

    The mode controllers finish on the last step without pushing it (the simulator's
    servers, and servers the run started, end with the run), which would leave servers the
    user keeps (``live.server_urls``, e.g. a ``tandem serve``) on the weights before. The
    push is not recorded: the run's figures end where its last step did."""
    await actor.faults.push(actor.config.step_offset + actor.controller.latest_version)


def _part_metrics(
    recorder: Recorder, offset: int, start_s: float, end_s: float,
    cpu_before: dict[str, float], cpu_after: dict[str, float],
) -> dict[str, float]:  # fmt: skip
    """This part of the run's time to its first step and its CPU per sample, by role."""
    mine = [st for st in recorder.steps if st["step"] >= offset]
    trained = sum(st["num_samples"] for st in mine)
    out = cpu_use_metrics(cpu_before, cpu_after, trained, end_s - start_s) if cpu_after else {}
    if mine:
        out["time_to_first_step_s"] = (mine[0].get("done_s") or mine[0]["end_s"]) - start_s
    return out


def _leaders(servers: Servers) -> list[int]:
    return [s.process.proc.pid for s in servers.slots.values() if s.process is not None]


def _cpu(trainer: TrainerClient, servers: Servers) -> dict[str, float]:
    """The run's CPU seconds so far by role (its own processes on this host)."""
    return run_cpu_by_role(trainer.pid, _leaders(servers))


def _cpu_timeline(
    spec: RunSpec, trainer: TrainerClient, servers: Servers, clock: Callable[[], float],
    on_row: OnRow | None = None,
) -> CpuTimeline | None:  # fmt: skip
    """The run's CPU timeline, started (None with ``live.cpu_sample_s: 0``); ``on_row``
    gets each row as it is measured."""
    if spec.live.cpu_sample_s <= 0:
        return None
    pids = run_pids_by_role(trainer.pid, _leaders(servers))
    timeline = CpuTimeline(pids, clock, spec.live.cpu_sample_s, on_row)
    timeline.start()
    return timeline


def make_actor(
    spec, clients, trainer, recorder, trained_ids, offset: int, ckpt: str, length_predictor,
    on_step, backend: str,
) -> Actor:  # fmt: skip
    tasks = task_set(spec)
    source = TaskPromptSource(tasks, spec.algorithm.batch_size, spec.algorithm.group_size)
    prompts = ResumablePrompts(source, trained_ids)
    recorder.iteration_of = prompts.iteration_of
    local = spec.model_copy(deep=True)
    local.run.iterations = spec.run.iterations - offset
    policies = live_policies(local, tasks, prompts, len(clients), length_predictor)
    config = ActorConfig(
        group_size=spec.algorithm.group_size, step_offset=offset, checkpoint_path=ckpt,
        checkpoint_every=spec.live.checkpoint_every, sampling_seed=spec.run.seed,
        checkpoint_interval_s=spec.live.checkpoint_min_interval_s,
        weight_host=spec.live.host,
        weight_backend=backend,
        num_steps=spec.run.iterations, stop_grace_s=spec.live.stop_grace_s,
    )  # fmt: skip
    predictor = policies.predictor
    learn = predictor.update if isinstance(predictor, OnlineLengthPredictor) else None
    return Actor(
        config, policies.controller, clients, trainer, tasks, policies.scheduling.priority,
        recorder, learn, on_step=on_step,
    )  # fmt: skip


def live_policies(
    spec: RunSpec,
    tasks: TaskSet,
    prompts: PromptSource,
    num_instances: int,
    ranker: LengthPredictor | None = None,
) -> RunPolicies:
    """The policies of a live run on ``num_instances`` servers (through the one builder):
    the truth is each task's reference answer length; with ``allocation: elastic`` the
    actor adds and retires servers as the controller decides."""
    inputs = ExecutorInputs(
        cost_model=live_cost_model(spec),
        prompts=prompts,
        rngs=RngStreams(spec.run.seed),
        micro_batch_samples=spec.live.micro_batch_samples,
        truth=lambda r: tasks[r.prompt_id].expected_output_tokens,
        calibration_lengths=[p.expected_output_tokens for p in tasks.prompts],
        ranker=ranker,
        can_scale_out=True,
    )
    views = instance_views(spec, lambda device: live_kv_capacity_tokens(spec), num_instances)
    return build_policies(spec, inputs, views)


def live_kv_capacity_tokens(spec: RunSpec) -> int:
    """KV-cache tokens one server may hold: every sequence at ``live.max_model_len``."""
    return spec.cluster.generation[0].max_num_seqs * spec.live.max_model_len


def _result(spec: RunSpec, recorder: Recorder, end_s: float, num_instances: int) -> RunResult:
    samples = sorted(recorder.samples.values(), key=lambda s: s.sample_id)
    spans = sorted(recorder.spans, key=lambda s: (s.start_s, s.resource))
    metrics = compute_metrics(
        samples, spans, end_s, {generation_resource(i): (0.0, end_s) for i in range(num_instances)},
        mode_of(spec).colocated, spec.run.iterations, None,
    )  # fmt: skip
    metrics["live_wall_s"] = end_s
    rewards = [s["mean_reward"] for s in recorder.steps if s.get("mean_reward") is not None]
    metrics["mean_reward_first_fifth"], metrics["mean_reward_last_fifth"] = _fifths(rewards)
    return RunResult(spec, metrics, samples, spans, steps=list(recorder.steps))


def _fifths(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    k = max(1, len(values) // 5)
    return sum(values[:k]) / k, sum(values[-k:]) / k
