"""``run_live``: one live run, on local processes or on a Ray cluster, resumable.

Locally (the default) it starts ``live.num_servers`` generation servers (or attaches to
``live.server_urls``) and the trainer as separate processes, generation pinned to the
first half of this machine's cores and training to the second; with ``ray_address``
the spec's ``cluster`` section is placed on a Ray cluster (:mod:`runtime.ray_launcher`:
servers and FSDP2 trainer ranks as Ray actors). Either way :func:`runtime.live_run.drive`
runs the actor loop and returns a :class:`RunResult` (also saved to ``out_dir``).
Ctrl-C or a crash stops every process it started (and a killed launcher takes them with
it: :mod:`runtime.procs`). A run directory holding a checkpoint resumes after the last
checkpointed step, only with a spec that trains the same thing (:mod:`runtime.run_dir`).

A server that dies mid-run is survived while another one serves
(:mod:`runtime.server_faults`); when the last one dies the run stops with one line
naming the process and the command that resumes it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import multiprocessing as mp
import os
from pathlib import Path

from policies.build import mode_of
from policies.logs import run_log
from policies.protocols import LengthPredictor
from policies.records import InflightHandling
from policies.results import RunResult
from policies.spec import RunSpec
from runtime.attach import (
    check_attached,
    control_token,
    given_token,
    inference_key,
    release_attached,
)
from runtime.core_loan import CoreLoan
from runtime.errors import LiveRunError, ProcessDied, RunInterrupted, TrainerFailed
from runtime.graceful_stop import StopRequests
from runtime.lease import owner_of
from runtime.live_run import (
    AfterStep,
    OnStep,
    drive,
    live_device,
    model_dir_for,
    trainer_config,
)
from runtime.model import check_model_dir, context_tokens, state_shapes
from runtime.procs import (
    ServerProcess,
    check_listen_host,
    server_core_sets,
    split_cores,
    start_server,
    stop_server,
    wait_healthy,
)
from runtime.run_dir import RunDir
from runtime.supervisor import Servers, ServerSlot
from runtime.tasks import check_context, task_set
from runtime.trainer_proc import TrainerProcess

log = logging.getLogger(__name__)
SPREAD_ENGINE_NICE = 8  # engine niceness where each server has a core (engine_nice)


def _check_supported(spec: RunSpec) -> None:
    if (
        spec.pipeline.mode == "pipeline"
        and spec.pipeline.inflight == InflightHandling.ABORT_RESUBMIT
    ):
        raise ValueError(
            "pipeline.inflight: 'abort-resubmit' is not implemented live; use keep or drain"
        )
    if spec.algorithm.group_size < 2:
        raise ValueError(
            f"algorithm.group_size {spec.algorithm.group_size}: the live loss's advantage is a "
            "sample's reward minus its group's mean (runtime/loss.py; no critic), so a group "
            "of one learns nothing; set algorithm.group_size to 2 or more"
        )
    if spec.live.temperature == 0:
        raise ValueError(
            "live.temperature 0: greedy sampling gives every sample of a group the same "
            "answer, so every advantage (reward minus its group's mean) is 0 and the run "
            "learns nothing; sample with a temperature above 0 (default 1)"
        )
    if spec.model.path:
        check_model_dir(spec.model.path, "model.path")
    if not spec.live.server_urls:  # attached servers: their own context (check_attached)
        model_tokens = context_tokens(spec.model.path or None)
        check_context(task_set(spec), spec.live.max_model_len, model_tokens=model_tokens)


def check_live_run(spec: RunSpec, ray_address: str | None = None) -> None:
    """A ``ValueError`` naming the key of what a live run (on ``ray_address``, if given)
    refuses; the CLI calls it before it makes the run directory."""
    _check_supported(spec)
    if ray_address is None and not spec.live.server_urls:  # the run starts its servers here
        check_listen_host(spec.live.host, "live.host")
    if ray_address is not None:  # what --ray cannot run stops here, before Ray starts
        from runtime.ray_launcher import check_ray_run

        check_ray_run(spec, ray_address)


def run_live(
    spec: RunSpec, out_dir: Path, length_predictor: LengthPredictor | None = None,
    force_new_spec: bool = False, after_step: AfterStep | None = None,
    on_step: OnStep | None = None, ray_address: str | None = None,
) -> RunResult:  # fmt: skip
    """Run ``spec`` on real vLLM servers and a torch trainer; write and return the result.

    ``length_predictor``: the predictor behind ``policies.length_predictor: ranker`` (built
    by the caller, e.g. an empty ``ranker.online.RankerPredictor``); one that can
    ``update`` learns from the run's own completions as they finish. ``force_new_spec``:
    resume a run directory even with a spec that changes training. ``after_step(step)``
    is awaited after every optimizer step and its checkpoint (tests); ``on_step`` gets a
    :class:`StepUpdate` after every optimizer step, as it happens (progress, tracking).
    ``ray_address``: run on that Ray cluster (``local``: start one on this machine).
    Ctrl-C and SIGTERM checkpoint the last trained step first (runtime.graceful_stop);
    the interrupt is a ``RunInterrupted`` saying how to go on. Once the results are saved,
    a first one only ends the shutdown, and the result is returned. A run refused before it
    starts (a spec a resume refuses, an attached server that would not serve it) writes
    nothing to ``out_dir``."""
    check_live_run(spec, ray_address)
    run_dir = RunDir(Path(out_dir), ray_address)
    run_dir.check(spec, force_new_spec)
    check_attached_servers(spec, run_dir.path)
    run_dir.prepare(spec, force_new_spec)  # before anything starts
    try:
        with run_log(run_dir.path), StopRequests(spec.live.stop_grace_s) as stops:
            if run_dir.finished(spec):
                log.info("%s holds this run, finished: its results as they are", run_dir.path)
                return RunResult.load(run_dir.path)
            if ray_address is not None:
                from runtime.ray_launcher import run_on_ray

                return run_on_ray(
                    spec, run_dir, ray_address, length_predictor, after_step, on_step, stops
                )
            return _run_processes(spec, run_dir, length_predictor, after_step, on_step, stops)
    except KeyboardInterrupt as err:  # Ctrl-C, SIGTERM: resumable once it checkpointed
        raise RunInterrupted(str(err), run_dir.how_to_go_on()) from err


def check_attached_servers(spec: RunSpec, out_dir: Path) -> None:
    """A :class:`StartRefused` naming the first server of ``live.server_urls`` that would
    not serve a run into ``out_dir`` (``runtime.attach.check_attached``: it answers, is
    free for this run, takes its token and key, holds its context, serves its model)."""
    live = spec.live
    if not live.server_urls:
        return
    params = state_shapes(model_dir_for(spec))  # the trainer's model against the served ones
    given = given_token(live)  # none: the run made one up, which no server takes
    owner = owner_of(out_dir)
    check_attached(live.server_urls, given, owner, inference_key(live), task_set(spec), params)


def _run_processes(
    spec: RunSpec, run_dir: RunDir, length_predictor, after_step, on_step,
    stops: StopRequests | None = None,
) -> RunResult:  # fmt: skip
    """Start (or attach to) the servers and the trainer, run, stop what was started."""
    model_dir = model_dir_for(spec)
    token = control_token(spec.live)
    gen_cores, train_cores = split_cores(spec.live.num_servers, time_shared=_time_shared(spec))
    started: list[ServerProcess] = []
    trainer = TrainerProcess(
        trainer_config(spec, model_dir), train_cores, spec.live.trainer_nice,
        _core_loan(spec, train_cores),
    )  # fmt: skip
    servers = Servers([], token)
    try:
        core_sets = server_core_sets(spec.live.num_servers, gen_cores, _spread_servers(spec))
        servers = _servers(spec, model_dir, token, core_sets, run_dir.path, started)
        log.info("starting the trainer process (cores %s)", train_cores)
        trainer.start()
        run_dir.record_processes(
            {"trainer": trainer.pid, **{f"server-{p.instance_id}": p.proc.pid for p in started}}
        )
        run = drive(
            spec, run_dir, trainer, servers, length_predictor, after_step, on_step, stops=stops
        )
        return asyncio.run(run)
    except (ProcessDied, TrainerFailed) as err:  # the run goes on from its checkpoint
        raise LiveRunError(f"{err}; {run_dir.how_to_go_on()}") from None
    finally:
        # its last checkpoint may still be writing; a stop's grace is one deadline, not two
        grace_s = spec.live.stop_grace_s
        trainer.stop(stops.grace_left_s(grace_s) if stops is not None else grace_s)
        for s in started:
            stop_server(s)
        servers.stop_all()  # restarted ones too
        if spec.live.server_urls:  # attached: free for the next run at once (runtime.lease)
            release_attached(spec.live.server_urls, token, servers.owner)


def _time_shared(spec: RunSpec) -> bool:
    """Generation and training take turns (colocated modes): while one stage runs the
    other idles, so the trainer gets every core, not half."""
    return mode_of(spec).colocated


def _core_loan(spec: RunSpec, train_cores: list[int]) -> CoreLoan | None:
    """The generation cores for the trainer while generation idles (``runtime.core_loan``):
    not where the stages already share every core (colocated), nor with servers this run
    did not start (their cores are not the run's to lend), a fixed ``trainer_threads``, or a
    trainer on a GPU."""
    every = sorted(os.sched_getaffinity(0))
    if (
        not spec.live.lend_idle_cores or spec.live.server_urls or spec.live.trainer_threads
        or live_device(spec) != "cpu" or not set(train_cores) < set(every)
    ):  # fmt: skip
        return None
    return CoreLoan(train_cores, every, mp.get_context("spawn"))


def _spread_servers(spec: RunSpec) -> bool:
    """Several servers get a core each, round robin over every core (the trainer shares
    one): a wave mode's batch waits for its slowest answers, and two engines sharing one
    core decoded those at half speed. ``pipeline`` kept its servers on the generation
    core while its trainer was the bottleneck; since the trainer skips zero-advantage
    samples and shares prompts (``live.skip_zero_advantage``, ``live.share_prompts``) it
    too ran faster spread, 9-26 % in three alternated pairs (docs/live-throughput.md,
    fifteenth session)."""
    return spec.live.num_servers >= 2


def engine_nice(spec: RunSpec) -> int:
    """``live.engine_nice``, or where unset: ``SPREAD_ENGINE_NICE`` on a CPU host, but 0
    for a single ``pipeline`` server (two sharing a core ran ~7 % slower niced) and on a
    GPU. Spread over two cores, ``disagg-sync`` and ``stream-async`` ran ~17 % faster
    with it in alternated runs, and their engines used ~20 % less CPU a sample
    (docs/live-throughput.md, fourteenth session)."""
    if spec.live.engine_nice is not None:
        return spec.live.engine_nice
    if live_device(spec) != "cpu":
        return 0
    return SPREAD_ENGINE_NICE if _spread_servers(spec) or not mode_of(spec).continuous else 0


def _servers(spec, model_dir, token, core_sets, out_dir, started) -> Servers:
    """Attach to ``live.server_urls`` (checked before the run started:
    :func:`check_attached_servers`), or start ``live.num_servers`` and wait for them."""
    live, owner = spec.live, owner_of(out_dir)
    if live.server_urls:
        slots = [ServerSlot(i, u) for i, u in enumerate(live.server_urls)]
        return Servers(slots, token, owner=owner)
    start = functools.partial(_start_server, spec, model_dir, token, core_sets, out_dir)
    started.extend(start(i) for i in range(live.num_servers))
    for s in started:
        wait_healthy(s, live.startup_timeout_s)
    slots = [ServerSlot(s.instance_id, s.base_url, s) for s in started]
    return Servers(slots, token, start, live.startup_timeout_s, live.restart_servers, owner)


def _start_server(spec, model_dir, token, core_sets, out_dir, i: int) -> ServerProcess:
    live = spec.live
    cores = core_sets[i % len(core_sets)]  # a restarted server keeps its cores
    return start_server(
        i, model_dir, live.host, live.base_port + i, token, cores, live.kv_cache_gib,
        live.max_model_len, spec.cluster.generation[0].max_num_seqs, out_dir / "logs",
        api_key=inference_key(live), engine_nice=engine_nice(spec),
    )  # fmt: skip


def main() -> None:
    """The entry point moved to the CLI, which builds every policy input the launcher
    cannot (the ranker of ``length_predictor: ranker`` lives in ``experiments``)."""
    raise SystemExit(
        "python -m runtime.launcher is gone: run `tandem run SPEC --live --out OUT_DIR "
        "[--set KEY=VALUE ...]` (or python -m experiments.cli run ...)"
    )


if __name__ == "__main__":
    main()
