"""One point of a sweep, and the loop that feeds points to an executor.

:func:`run_point` is the one function that simulates a point: the local worker processes
(:mod:`experiments.sweep`) and the Ray tasks (:mod:`experiments.sweep_ray`) both call it,
so a point gives the same row under either. :func:`run_jobs` drives any
:class:`PointPool` (submit while there is room, hand each finished row on, stop what is
left on the way out, Ctrl-C included).
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from experiments.runs import check_run, simulate
from experiments.worker_pool import over_time
from policies.given_split import replaced_split, split_keys_given
from policies.inert_keys import log_inert_keys
from policies.logs import held_warnings, run_log
from policies.spec import RunSpec, SpecError, override_spec, read_yaml

log = logging.getLogger(__name__)

Row = dict[str, Any]  # a point's values, its metrics or its error (the sweep's table row)
WARNINGS = "warnings"  # a row's key for what its run warned of (the sweep logs, not keeps, it)
OnRow = Callable[[int, Row], None]
LAG_KEY = "pipeline.max_lag"  # null: the mode's own lag (a grid of modes × lags needs it)


def point_overrides(point: dict[str, Any]) -> list[str]:
    """The point as ``--set`` overrides: ``key=value``, the value as YAML."""
    return [
        f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
        for k, v in point.items()
    ]


def point_spec(base: RunSpec, point: dict[str, Any]) -> RunSpec:
    return override_spec(base, point_overrides(point))


def check_point_specs(
    base: RunSpec,
    points: list[dict[str, Any]],
    skip_invalid: bool = False,
    overrides: Sequence[str] = (),
) -> dict[int, str]:
    """Build every point's spec and check it as ``tandem run`` does before simulating
    (:func:`experiments.runs.check_run`: the simulator's checks and the ranker file of
    ``policies.ranker_path``; nothing runs): the first invalid one is a
    :class:`SpecError` naming the point's ``key=value`` settings and what is wrong. With
    ``skip_invalid`` (``--skip-invalid``) the invalid points are returned instead, by
    index, with what is wrong (a grid of ``pipeline.mode`` × ``pipeline.max_lag`` holds
    combinations no mode takes); only a grid of nothing but those is an error. What the
    points would warn about (keys that do nothing, a trainer whose optimizer must be
    offloaded) is logged once for all the points that share it, and so is a split that
    ``balanced`` replaces, given by the grid or by ``overrides`` (the sweep's ``--set``:
    :mod:`policies.given_split`)."""
    specs, warnings, invalid = [], [], {}
    ranker_files: set[str] = set()  # loaded and accepted once for all points
    for index, point in enumerate(points):
        try:
            spec = point_spec(base, point)
            warnings += check_run(spec, ranker_files_passed=ranker_files)
        except (SpecError, ValueError) as err:
            wrong = f"{err}{_lag_hint(point, err)}"
            if not skip_invalid:
                why = f"grid point {' '.join(point_overrides(point))}: {wrong}"
                raise SpecError(f"{why} (--skip-invalid leaves such points out)") from None
            invalid[index] = wrong
            continue
        specs.append(spec)
    if invalid and not specs:
        raise SpecError(
            f"every point of the grid is invalid; the first: {next(iter(invalid.values()))}"
        )
    log_inert_keys(specs)
    given = split_keys_given([*overrides, *(o for p in points for o in point_overrides(p))])
    warnings += replaced_split(specs, given)
    for warning in dict.fromkeys(warnings):
        log.warning("%s", warning)
    return invalid


def _lag_hint(point: dict[str, Any], err: Exception) -> str:
    """For a grid's lag refused by a mode that fixes its own: how a grid gives it that."""
    if LAG_KEY in point and str(err).startswith(f"{LAG_KEY}:"):
        return f"; a grid's {LAG_KEY}=null point runs each mode at its own lag"
    return ""


def base_from_yaml(text: str) -> RunSpec:
    """The sweep's base spec as a worker receives it (its resolved YAML)."""
    return RunSpec.model_validate(read_yaml(text, RunSpec))


def run_point(base: RunSpec, point: dict[str, Any], out_dir: Path | None) -> Row:
    """Simulate one grid point; a failure becomes a row with its error, never an exception.

    ``out_dir``: where the point's run files go (spec.yaml, metrics.json, run.log...); its
    metrics (and the row) say where its ranker came from and how well it ranked, as a
    ``tandem run``'s do. What the run warned of goes to its run.log, not to the console,
    and comes back under the row's :data:`WARNINGS` key: the sweep says each once."""
    row: Row = dict(point)
    with held_warnings() as warned:  # in the point's run.log; the sweep says each once
        try:
            spec = point_spec(base, point)
            if out_dir is None:
                result = simulate(spec)
            else:
                with run_log(out_dir):
                    result = simulate(spec)
                    result.save(out_dir, trace_by_default=False)
            row.update(result.metrics)
            row["error"] = None
        except Exception as err:  # noqa: BLE001 - one failing point must not lose the others
            row["error"] = f"{type(err).__name__}: {err}"
            row["traceback"] = traceback.format_exc(limit=3)
    if warned:
        row[WARNINGS] = list(dict.fromkeys(warned))
    return row


def point_dir(out: Path, index: int) -> Path:
    """Where point ``index`` of a sweep into ``out`` keeps its files."""
    return out / "points" / f"{index:04d}"


def timeout_row(timeout_s: float) -> Row:
    """The row of a point stopped for running over ``timeout_s``."""
    return {"error": over_time(timeout_s)}


class PointPool(Protocol):
    """Runs a sweep's points (worker processes, Ray tasks) and hands back their rows."""

    def has_room(self) -> bool:
        """Whether another point may be submitted now."""
        ...

    def num_busy(self) -> int:
        """Points submitted and not yet collected."""
        ...

    def submit(self, index: int, point: dict[str, Any]) -> None: ...

    def collect(self) -> list[tuple[int, Row]]:
        """The points finished (or stopped) since the last call; waits briefly for one."""
        ...

    def close(self) -> None:
        """Stop every point still running; the pool is not used again."""
        ...


def run_jobs(pool: PointPool, jobs: list[tuple[int, dict[str, Any]]], on_row: OnRow) -> None:
    """Run every ``(index, point)`` of ``jobs`` on ``pool``, in order, calling ``on_row``
    as each finishes; ``pool`` is closed however this ends (an error, Ctrl-C)."""
    todo = list(reversed(jobs))
    try:
        while todo or pool.num_busy():
            while todo and pool.has_room():
                pool.submit(*todo.pop())
            for index, row in pool.collect():
                on_row(index, row)
    finally:
        pool.close()
