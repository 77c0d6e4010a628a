"""The points of a reproduction study, simulated in worker processes with a progress bar.

:func:`run_points` simulates each distinct point once (two figures asking for the same
run share it) in the sweep's worker processes
(:class:`~experiments.worker_pool.WorkerProcesses`), driven by the sweep's loop
(:func:`experiments.sweep_point.run_jobs`), so a study stops as a sweep does: whatever
ends the loop (an error, Ctrl-C, SIGTERM) kills the points still running, and the
command exits at once and leaves no process behind.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from experiments.reproduce.points import Point, PointResult, run_one
from experiments.sweep_point import run_jobs
from experiments.worker_pool import WorkerProcesses
from policies.spec import RunSpec


def _run_job(index: int, point: Point) -> PointResult:
    return run_one(point)


def _failed(point: Point, why: str) -> PointResult:
    return PointResult(point, {}, 0, 0, error=why)


def _work_hint(spec: RunSpec) -> float:
    """A rough size of a run (samples × max tokens), to start the longest runs first."""
    w = spec.workload
    return (
        spec.run.iterations
        * spec.algorithm.batch_size
        * (w.final_max_output_tokens or w.max_output_tokens)
    )


def run_points(
    points: Sequence[Point], workers: int, label: str, console: Console | None = None
) -> dict[Point, PointResult]:
    """Simulate every distinct point in ``workers`` processes, with a progress bar."""
    specs = {p: p.spec() for p in dict.fromkeys(points)}  # bad overrides fail before any run
    unique = sorted(specs, key=lambda p: -_work_hint(specs[p]))  # longest first packs better
    results: dict[Point, PointResult] = {}
    columns = [*Progress.get_default_columns()[:1], BarColumn(), MofNCompleteColumn()]
    with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task(label, total=len(unique))

        def on_result(index: int, result: PointResult) -> None:
            results[unique[index]] = result
            bar.advance(task)

        pool = WorkerProcesses(_run_job, workers, _failed)
        run_jobs(pool, list(enumerate(unique)), on_result)  # closes the pool
    failed = [r for r in results.values() if r.error]
    if failed:
        raise RuntimeError(f"{len(failed)} point(s) failed; first: {failed[0].error}")
    return results
