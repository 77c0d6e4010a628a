"""Parameter sweeps: every combination of a grid, simulated in parallel worker processes
or, with ``ray_address``, as Ray tasks (:mod:`experiments.sweep_ray`).

Each point's row (its values, metrics or error) is written to ``points/NNNN/row.json``
the moment it finishes, and ``results.parquet`` / ``results.csv`` gather every row at the
end, ``status.json`` saying ``complete``. A sweep stopped (Ctrl-C, SIGTERM) with points
left writes them for the rows it has, ``status.json`` saying ``partial``. A second sweep
into the same ``--out`` (same spec and grid) resumes: points with a row and no error are
not simulated again, and the tables are written anew. ``point_timeout_s`` bounds each
point: a worker over it is killed and its point recorded as failed, its directory cleared
of the result files it may have written (``RunResult.clear``; a resume runs it again).
Workers die with the sweep (``PR_SET_PDEATHSIG``). Both executors simulate a point with
:func:`experiments.sweep_point.run_point` and are driven by one loop,
:func:`experiments.sweep_point.run_jobs`.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import itertools
import json
import logging
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.progress import Progress

from experiments.sweep_point import (
    WARNINGS,
    PointPool,
    Row,
    base_from_yaml,
    point_dir,
    run_jobs,
    run_point,
)
from experiments.worker_pool import WorkerProcesses
from policies.results import RunResult, write_atomic
from policies.spec import RunSpec, SpecError, read_value
from runtime.errors import RunInterrupted

log = logging.getLogger(__name__)

DEFAULT_WORKERS = 2  # local worker processes when none are asked for


class SweepStatus(enum.StrEnum):
    """What ``results.csv`` holds (``status.json``)."""

    PARTIAL = "partial"  # stopped with points left: the rows so far; a resume completes it
    COMPLETE = "complete"  # a row for every point run (failed ones included)


@dataclass(frozen=True, slots=True)
class SweepResult:
    frame: pd.DataFrame  # one row per point, in the grid's order
    num_already_done: int  # points a resumed sweep found done and did not simulate again
    stopped_after_last: bool = False  # Ctrl-C (or SIGTERM) came once every point had run


@dataclass(frozen=True, slots=True)
class GridAxis:
    """One axis of a grid: its keys (one, or several linked ones that vary together) and,
    for each of its points, one value per key."""

    keys: tuple[str, ...]
    values: tuple[tuple[Any, ...], ...]


def parse_grid(text: str) -> GridAxis:
    """``key=v1,v2,...``: a spec key and its values, each read as ``--set`` reads one (YAML;
    the text as typed for a key that holds text). Linked keys,
    ``k1,k2=a1:b1,a2:b2``, vary together (not as a product): each value is a tuple with
    one value per key, joined by ``:`` (so a linked key's value cannot hold a ``:``)."""
    if "=" not in text:
        raise SpecError(f"grid {text!r} must look like key=v1,v2 (or k1,k2=a1:b1,a2:b2)")
    head, raw = text.split("=", 1)
    keys = tuple(_axis_key(part, text) for part in head.split(","))
    name = ",".join(keys)
    if not raw.strip():
        raise SpecError(f"grid {text!r} has no values")
    if any(not v.strip() for v in raw.split(",")):
        raise SpecError(f"grid {name}: an empty value in {raw!r} (two commas, or one at an end)")
    if len(keys) == 1:
        return GridAxis(keys, tuple((_value(v, keys[0], name),) for v in raw.split(",")))
    return GridAxis(keys, tuple(_linked(v, keys) for v in raw.split(",")))


def _axis_key(part: str, text: str) -> str:
    key = ".".join(p for p in part.strip().split(".") if p)
    if not key:
        raise SpecError(f"grid {text!r} has an empty key")
    _check_key(key)
    return key


def _value(raw: str, key: str, name: str) -> Any:
    """``raw`` as YAML, or as typed for a key that holds text (as ``--set`` reads it)."""
    try:
        return read_value(raw.strip(), key.split("."), RunSpec)
    except yaml.YAMLError as err:
        raise SpecError(f"grid {name}: {raw!r} is not valid YAML ({err})") from None


def _linked(raw: str, keys: tuple[str, ...]) -> tuple[Any, ...]:
    """One point of linked ``keys``: ``a:b``, a value per key."""
    name, parts = ",".join(keys), raw.split(":")
    if len(parts) != len(keys):
        raise SpecError(
            f"grid {name}: {raw!r} has {len(parts)} value(s) for {len(keys)} linked keys "
            f"(one per key, joined by ':', e.g. {':'.join(['V'] * len(keys))})"
        )
    if any(not p.strip() for p in parts):
        raise SpecError(f"grid {name}: an empty value in {raw!r}")
    return tuple(_value(p, key, name) for p, key in zip(parts, keys, strict=True))


def _check_key(key: str) -> None:
    """An axis must set a spec key or section (``tandem spec keys``; list items by index)."""
    from experiments.spec_keys import spec_keys

    generic = ".".join("N" if part.isdigit() else part for part in key.split("."))
    known = [k.key for k in spec_keys()]
    if not any(k == generic or k.startswith(generic + ".") for k in known):
        raise SpecError(f"grid {key}: unknown spec key (tandem spec keys lists them)")


def grid_points(axes: list[GridAxis]) -> list[dict[str, Any]]:
    """Every combination of ``axes`` (linked keys keep their values together); a key given
    twice, or a value twice on one axis, is a :class:`SpecError` (it would make points
    that are the same run)."""
    keys = [k for a in axes for k in a.keys]
    if twice := sorted({k for k in keys if keys.count(k) > 1}):
        raise SpecError(
            f"grid: {', '.join(twice)} given as more than one --grid axis (or linked key)"
        )
    for axis in axes:
        seen = [
            ":".join(json.dumps(x, sort_keys=True, default=str) for x in v) for v in axis.values
        ]
        if repeated := sorted({v for v in seen if seen.count(v) > 1}):
            raise SpecError(f"grid {','.join(axis.keys)}: the value {repeated[0]} is given twice")
    return [
        dict(zip(keys, itertools.chain.from_iterable(combo)))
        for combo in itertools.product(*(a.values for a in axes))
    ]


def _run_job(base_yaml: str, out: str, index: int, point: dict[str, Any]) -> Row:
    """A sweep point, run in a worker process (its base spec travels as YAML)."""
    return run_point(base_from_yaml(base_yaml), point, point_dir(Path(out), index))


def _failed(point: dict[str, Any], why: str) -> Row:
    return {"error": why}


def _check_same_sweep(out: Path, base: RunSpec, points: list[dict]) -> None:
    """``sweep.json`` names the sweep ``out`` holds; another spec or grid is an error."""
    record = json.dumps({"spec": base.to_yaml(), "points": points}, sort_keys=True, default=str)
    path = out / "sweep.json"
    if path.exists() and path.read_text() != record:
        raise SpecError(
            f"{out} holds a sweep of another spec or grid; use another --out (its points "
            "would not match)"
        )
    write_atomic(path, record.encode())


def _clear_failed(directory: Path) -> None:
    """A failed point's directory must not look like a finished run: a worker stopped while
    saving (over ``point_timeout_s``, killed) leaves the result files it had written, each
    whole (``write_atomic``). They go; its spec.yaml and run.log stay, to say what ran."""
    if gone := RunResult.clear(directory):
        log.info("%s failed: removed its partial results %s", directory, ", ".join(gone))


def _done_rows(out: Path, points: list[dict]) -> dict[int, dict]:
    rows = {}
    for i in range(len(points)):
        path = point_dir(out, i) / "row.json"
        if path.exists():
            row = json.loads(path.read_text())
            if row.get("error") is None:
                rows[i] = row
    return rows


def run_sweep(
    base: RunSpec, axes: list[GridAxis], out: Path, workers: int | None = None,
    quiet: bool = False, point_timeout_s: float | None = None, ray_address: str | None = None,
    left_out: dict[int, str] | None = None, warned: Collection[str] = (),
) -> SweepResult:  # fmt: skip
    """Every point of the grid ``axes`` over ``base``, simulated into ``out``; the table.

    ``ray_address``: None runs the points in ``workers`` local processes (default 2);
    ``"local"`` in a Ray instance started for the sweep on 127.0.0.1 with ``workers`` CPUs
    (default: this machine's cores); ``"auto"`` or ``host:port`` on that Ray cluster, at
    most ``workers`` points at once (default: as many as it runs). ``left_out``: points
    not run, by index, with why (``--skip-invalid``; listed in ``left_out.csv``).
    ``warned``: warnings already said (the points' checks); a point's run says the others,
    each once."""
    points = grid_points(axes)
    out.mkdir(parents=True, exist_ok=True)
    _check_same_sweep(out, base, points)
    write_atomic(out / "spec.yaml", base.to_yaml().encode())
    rows = _done_rows(out, points)  # a resumed sweep skips the points already done
    left_out = left_out or {}
    _save_left_out(out, points, left_out)

    said = set(warned)

    def on_row(index: int, row: Row) -> None:
        for warning in row.pop(WARNINGS, ()):  # each once, and not what the checks said
            if warning not in said:
                said.add(warning)
                log.warning("grid point %d (%s): %s", index, point_dir(out, index), warning)
        row = {"point": index, **points[index], **row}
        if row.get("error") is not None:
            _clear_failed(point_dir(out, index))
        write_atomic(point_dir(out, index) / "row.json", json.dumps(row, default=str).encode())
        rows[index] = row  # only once its row.json is written
        bar.advance(task)

    jobs = [(i, p) for i, p in enumerate(points) if i not in rows and i not in left_out]
    num_done, stopped = len(rows), False
    try:
        with (
            _pool(base, out, workers, point_timeout_s, ray_address) as pool,
            Progress(disable=quiet or not jobs) as bar,  # nothing left: no bar without an ETA
        ):
            name = f"sweep ({num_done} already done)" if num_done else "sweep"
            task = bar.add_task(name, total=len(points) - len(left_out), completed=num_done)
            run_jobs(pool, jobs, on_row)
    except KeyboardInterrupt as err:
        if any(i not in rows for i, _ in jobs):  # points were left: the sweep stops
            num_points = len(points) - len(left_out)
            _save(_frame(rows, points), out, SweepStatus.PARTIAL, num_points)
            raise RunInterrupted(str(err), _partial_note(out, len(rows), num_points)) from err
        stopped = True  # it came after the last point: there was nothing left to stop
    frame = _frame(rows, points)
    _save(frame, out, SweepStatus.COMPLETE, len(points) - len(left_out))
    return SweepResult(frame, num_done, stopped)


def _frame(rows: dict[int, Row], points: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows in the grid's order (none yet: the columns of the points and ``error``)."""
    if not rows:
        return pd.DataFrame(columns=["point", *points[0], "error"])
    return pd.DataFrame([rows[i] for i in sorted(rows)]).reset_index(drop=True)


def _partial_note(out: Path, num_done: int, num_points: int) -> str:
    return (
        f"partial results ({num_done} of {num_points} points) in {out / 'results.csv'} "
        "(status.json: partial); the same command again resumes the sweep"
    )


@contextlib.contextmanager
def _pool(
    base: RunSpec, out: Path, workers: int | None, timeout_s: float | None,
    ray_address: str | None,
) -> Iterator[PointPool]:  # fmt: skip
    if ray_address is None:
        work = functools.partial(_run_job, base.to_yaml(), str(out))
        yield WorkerProcesses(work, workers or DEFAULT_WORKERS, _failed, timeout_s)
        return
    from experiments.sweep_ray import RayPool
    from runtime.ray_session import ray_session

    with ray_session(ray_address, num_cpus=workers):
        yield RayPool(base, out, workers, timeout_s)


def _save_left_out(out: Path, points: list[dict], left_out: dict[int, str]) -> None:
    """``left_out.csv``: the points not run and why (none: no file, an earlier one goes)."""
    path = out / "left_out.csv"
    if not left_out:
        path.unlink(missing_ok=True)
        return
    rows = [{"point": i, **points[i], "why": why} for i, why in sorted(left_out.items())]
    write_atomic(path, pd.DataFrame(rows).to_csv(index=False).encode())


def _save(frame: pd.DataFrame, out: Path, status: SweepStatus, num_points: int) -> None:
    """``results.parquet``, ``results.csv`` and ``status.json``, each written whole. A
    partial status goes first and a complete one last, so a crash between them never
    leaves ``complete`` beside partial tables."""
    import io

    record = {"status": status.value, "num_points_run": len(frame), "num_points": num_points}
    status_json = json.dumps(record, indent=2).encode()
    if status is SweepStatus.PARTIAL:
        write_atomic(out / "status.json", status_json)
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    write_atomic(out / "results.parquet", buf.getvalue())
    write_atomic(out / "results.csv", frame.to_csv(index=False).encode())
    if status is SweepStatus.COMPLETE:
        write_atomic(out / "status.json", status_json)
