"""Simulating candidates: the worker function, its typed result, the process pool, and the
low-fidelity read-out of a short run.

A short run (rung 0) simulates two "units" of the schedule (two optimizer steps; two
generation waves of ``G`` steps for ``conventional``) and extrapolates the full run's
throughput as ``I·B / (T_first + (I/G - 1)·T_steady)``: the first unit's end time covers
the warm-up, the second unit's length the steady state. ``pipeline`` (continuous
generation) has no unit boundary to read, so its short run reports its own throughput.
"""

from __future__ import annotations

import json
import os
import signal
import time
import traceback
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from experiments.advise_space import Candidate, candidate_spec
from experiments.predictors import ranker_for
from policies.logs import held_warnings
from policies.modes import MODES
from policies.spec import RunSpec
from runtime.lifetime import die_with_parent
from sim.simulator import Simulation

METRIC_KEYS = (
    "throughput_samples_per_s",
    "cost_normalized_throughput",
    "max_staleness",
    "mean_staleness",
    "generation_utilization",
    "trainer_utilization",
    "iteration_time_s",
    "num_samples_trained",
)
OBJECTIVES = {
    "throughput": "throughput_samples_per_s",
    "cost-normalized": "cost_normalized_throughput",
}


@dataclass(frozen=True, slots=True)
class Evaluation:
    """One simulation of one candidate: its metrics, or the error that stopped it."""

    candidate: Candidate
    iterations: int
    metrics: dict[str, float | None]
    step_end_s: tuple[float, ...]
    wall_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def value(self, objective: str, full_iterations: int) -> float | None:
        """The objective as a full run would report it (extrapolated on a short run)."""
        if not self.ok:
            return None
        raw = self.metrics.get(OBJECTIVES[objective])
        if raw is None or self.iterations >= full_iterations:
            return raw
        scale = extrapolated_throughput(self, full_iterations)
        thr = self.metrics["throughput_samples_per_s"]
        return raw if scale is None or not thr else raw * scale / thr

    def to_row(self) -> dict[str, Any]:
        return {
            "iterations": self.iterations,
            **self.metrics,
            "step_end_s": json.dumps([round(t, 6) for t in self.step_end_s]),
            "wall_s": self.wall_s,
            "error": self.error,
        }


def short_iterations(c: Candidate, full_iterations: int) -> int:
    """Rung 0's length: two units of the schedule (0: no shorter run than the full one)."""
    unit = unit_steps(c)
    return 2 * unit if 2 * unit < full_iterations else 0


def unit_steps(c: Candidate) -> int:
    traits = MODES.get(c.structure.mode)
    return (c.structure.lag or 0) + 1 if traits.conventional else 1


def extrapolated_throughput(e: Evaluation, full_iterations: int) -> float | None:
    traits = MODES.get(e.candidate.structure.mode)
    unit = unit_steps(e.candidate)
    ends = e.step_end_s
    if traits.continuous or len(ends) < 2 * unit:
        return None
    first, steady = ends[unit - 1], ends[2 * unit - 1] - ends[unit - 1]
    total_s = first + (full_iterations // unit - 1) * steady
    per_step = (e.metrics["num_samples_trained"] or 0.0) / len(ends)
    return full_iterations * per_step / total_s if total_s > 0 else None


# -- the worker ----------------------------------------------------------------------------

_RANKERS: dict[str, Any] = {}  # per worker process: fitting a ranker costs ~1 s


def _ranker(spec: RunSpec) -> Any:
    if spec.policies.length_predictor != "ranker":
        return None
    key = json.dumps(
        [spec.workload.model_dump(mode="json"), spec.algorithm.model_dump(mode="json"),
         spec.run.seed, spec.run.iterations],
        sort_keys=True,
    )  # fmt: skip
    if key not in _RANKERS:
        _RANKERS[key] = ranker_for(spec)
    return _RANKERS[key].run_copy()  # a run records its own history: never a shared one


def run_candidate(base: RunSpec, c: Candidate, iterations: int) -> Evaluation:
    """Simulate ``c`` for ``iterations``; a failure becomes an :class:`Evaluation` with its
    error, never an exception (one bad point must not stop a search)."""
    start = time.perf_counter()
    try:
        spec = candidate_spec(base, c)
        spec = spec.model_copy(
            update={"run": spec.run.model_copy(update={"iterations": iterations})}
        )
        with held_warnings():  # the search's own runs: advice.md lists the advice's warnings
            result = Simulation(spec, ranker=_ranker(spec)).run()
    except Exception as err:  # noqa: BLE001 - reported with the candidate, not raised
        detail = traceback.format_exc(limit=2).strip().splitlines()[-1]
        return Evaluation(
            c,
            iterations,
            {},
            (),
            time.perf_counter() - start,
            f"{type(err).__name__}: {err} ({detail})",
        )
    metrics = {k: result.metrics.get(k) for k in METRIC_KEYS}
    ends = tuple(float(s["end_s"]) for s in sorted(result.steps, key=lambda s: s["step"]))
    return Evaluation(c, iterations, metrics, ends, time.perf_counter() - start)


class PoolEvaluator:
    """Candidates simulated in ``workers`` processes (in this process when ``workers`` is 1)."""

    def __init__(self, base: RunSpec, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"--workers must be at least 1, got {workers}")
        self.base = base
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def submit(self, c: Candidate, iterations: int) -> Future[Evaluation]:
        if self.workers == 1:
            future: Future[Evaluation] = Future()
            future.set_result(run_candidate(self.base, c, iterations))
            return future
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=self.workers,
                initializer=die_with_parent,
                initargs=(signal.SIGKILL, os.getpid()),
            )  # workers die with this process
        return self._pool.submit(run_candidate, self.base, c, iterations)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
