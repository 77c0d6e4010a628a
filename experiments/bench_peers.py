"""``tandem bench peers``: TRL's ``GRPOTrainer`` and tandem's pipeline modes on the same
model, tasks, reward, batch shape and cores, in alternating rounds.

Each round runs every system once — TRL (:mod:`experiments.peers_trl`) and each tandem
mode (:mod:`experiments.peers_tandem`) — each in a fresh process, in an order rotated by
the round, so that drift in the machine's speed hits every system alike. Round ``a``
samples with seed ``run.seed + a`` (every system of the round sees the same prompts);
the model is one directory for all (the spec's, or the tiny model of ``run.seed``).

Around every run the CPU time that *other* processes took is measured
(:mod:`experiments.peers_load`); a round in which any run lost more than
``max_other_share`` of the host's CPU to other load is rejected (it stops there) and,
up to ``max_reruns`` times, run again. Figures are medians over the accepted rounds
(:mod:`experiments.peers_report`).

The systems share 2 cores differently, each as it is built to: tandem pins its vLLM
engine to one core and its trainer (``live.trainer_threads`` threads) to the other; TRL
generates and trains in one process with ``threads`` torch threads.

Prints nothing; the CLI (:mod:`experiments.peers_cmd`) prints.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import experiments
from experiments.peers_load import (
    MAX_OTHER_SHARE,
    RunLoad,
    become_subreaper,
    disturbance,
    load_between,
    reap_orphans,
    snapshot,
)
from experiments.peers_rates import Rates, StepSeries, rates
from experiments.peers_tandem import read_run, tandem_command
from experiments.peers_trl import TrlJob
from policies.spec import RunSpec, override_spec
from runtime.errors import LiveRunError, describe_exit

TRL = "trl"
DEFAULT_MODES = ("disagg-sync", "stream-async", "pipeline", "colocated-sync")
DEFAULT_STEPS = 20
DEFAULT_ROUNDS = 3
TRL_THREADS = 2
STOP_TIMEOUT_S = 60.0  # a run told to stop (SIGTERM) gets this long to stop its servers

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class PeerBenchConfig:
    """What ``bench peers`` runs. ``spec`` is resolved (its ``model.path`` set)."""

    spec: RunSpec
    out_dir: Path
    steps: int = DEFAULT_STEPS  # timed optimizer steps per run
    rounds: int = DEFAULT_ROUNDS  # accepted rounds wanted
    modes: tuple[str, ...] = DEFAULT_MODES
    max_other_share: float = MAX_OTHER_SHARE  # of the host's CPU, per run
    max_reruns: int = 2  # rejected rounds run again, at most
    trl_threads: int = TRL_THREADS

    def __post_init__(self) -> None:
        if self.steps < 2:
            raise ValueError(f"--steps must be at least 2 (a steady state), got {self.steps}")
        if self.rounds < 1:
            raise ValueError(f"--rounds must be at least 1, got {self.rounds}")
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"--modes must name distinct modes, got {list(self.modes)}")
        if not self.spec.model.path:
            raise ValueError("the spec's model.path must be resolved before the benchmark")

    @property
    def systems(self) -> tuple[str, ...]:
        return (TRL, *self.modes)


@dataclass(slots=True, frozen=True)
class SystemRun:
    """One run of one system in one round."""

    system: str
    attempt: int  # the round's index, rejected rounds included
    rates: Rates
    load: RunLoad
    disturbed: str | None  # why other load disturbed it, or None


@dataclass(slots=True)
class RoundResult:
    attempt: int
    seed: int
    runs: list[SystemRun] = field(default_factory=list)

    @property
    def rejected(self) -> str | None:
        """Why the round is rejected (its first disturbed run), or None if accepted."""
        for run in self.runs:
            if run.disturbed:
                return f"{run.system}: {run.disturbed}"
        return None


def rotated(systems: tuple[str, ...], attempt: int) -> tuple[str, ...]:
    """``systems`` rotated by ``attempt``, so that each runs first in turn."""
    k = attempt % len(systems)
    return systems[k:] + systems[:k]


def bench_peers(
    config: PeerBenchConfig, on_run: Callable[[RoundResult, SystemRun], None] | None = None
) -> list[RoundResult]:
    """Rounds until ``config.rounds`` are accepted or the reruns are spent; every round,
    rejected ones included. ``on_run`` hears of every finished run (progress)."""
    become_subreaper()  # so that every descendant's CPU time reaches our rusage
    results: list[RoundResult] = []
    attempt = 0
    while (
        sum(r.rejected is None for r in results) < config.rounds
        and attempt < config.rounds + config.max_reruns
    ):
        results.append(run_round(config, attempt, on_run))
        if results[-1].rejected:
            log.warning("round %d rejected: %s", attempt + 1, results[-1].rejected)
        attempt += 1
    return results


def run_round(
    config: PeerBenchConfig, attempt: int,
    on_run: Callable[[RoundResult, SystemRun], None] | None = None,
) -> RoundResult:  # fmt: skip
    """Every system once, in the order of :func:`rotated`, with seed ``run.seed + attempt``;
    a round stops at its first disturbed run."""
    seed = config.spec.run.seed + attempt
    result = RoundResult(attempt, seed)
    round_dir = config.out_dir / f"round-{attempt}"
    round_dir.mkdir(parents=True, exist_ok=True)
    spec = override_spec(config.spec, [f"run.seed={seed}"])
    spec_path = round_dir / "spec.yaml"
    spec_path.write_text(spec.to_yaml())
    for system in rotated(config.systems, attempt):
        log.info("round %d: %s", attempt + 1, system)
        before = snapshot()
        series = run_system(config, spec, spec_path, system, round_dir / system)
        reap_orphans()
        load = load_between(before, snapshot())
        run = SystemRun(
            system, attempt, rates(series), load, disturbance(load, config.max_other_share)
        )
        result.runs.append(run)
        if on_run is not None:
            on_run(result, run)
        if run.disturbed:
            break  # the round is rejected: the rest of it would be time lost
    return result


def run_system(
    config: PeerBenchConfig, spec: RunSpec, spec_path: Path, system: str, out: Path
) -> StepSeries:
    """One run of ``system`` in its own process; its step series."""
    if system == TRL:
        out.mkdir(parents=True, exist_ok=True)
        job = trl_job(spec, config.steps, config.trl_threads, out / "trainer")
        job.save(out / "job.json")
        cmd = [sys.executable, "-m", "experiments.peers_trl", str(out / "job.json"),
               str(out / "result.json")]  # fmt: skip
        run_process(cmd, out / "run.log", f"{TRL} ({out})", threads=config.trl_threads)
        return StepSeries.from_json(json.loads((out / "result.json").read_text())["series"])
    out.parent.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{system}.log"
    run_process(tandem_command(spec_path, system, config.steps, out), log_path, system)
    return read_run(out)


def trl_job(spec: RunSpec, steps: int, threads: int, out_dir: Path) -> TrlJob:
    """The TRL run that matches ``spec``'s model, tasks and algorithm."""
    assert spec.model.path, "resolved spec expected"
    return TrlJob(
        model_dir=spec.model.path, seed=spec.run.seed, num_prompts=spec.workload.num_prompts,
        max_output_tokens=spec.workload.max_output_tokens, tasks=spec.workload.tasks,
        batch_size=spec.algorithm.batch_size, group_size=spec.algorithm.group_size,
        learning_rate=spec.algorithm.learning_rate, clip_epsilon=spec.algorithm.clip_epsilon,
        temperature=spec.live.temperature, steps=steps, threads=threads, out_dir=str(out_dir),
    )  # fmt: skip


def run_process(cmd: list[str], log_path: Path, what: str, threads: int | None = None) -> None:
    """Run ``cmd`` with this checkout's packages first on its path, output to ``log_path``;
    on an interrupt it is told to stop (SIGTERM: a tandem run stops its servers), then
    killed. A failure is a :class:`LiveRunError` naming the log."""
    env = dict(os.environ)
    root = str(Path(experiments.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
        try:
            returncode = proc.wait()
        except BaseException:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
    if returncode:
        raise LiveRunError(f"bench peers: {what} {describe_exit(returncode)}; see {log_path}")
