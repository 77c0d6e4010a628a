"""Parameter sweeps: every combination of a grid, simulated in parallel worker processes.

Each point's row (its values, metrics or error) is written to ``points/NNNN/row.json``
the moment it finishes, and ``results.parquet`` / ``results.csv`` gather every row at the
end. A second sweep into the same ``--out`` (same spec and grid) resumes: points with a
row and no error are not simulated again. ``point_timeout_s`` bounds each point: a
worker over it is killed and its point recorded as failed. Workers die with the sweep
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.progress import Progress

from experiments.predictors import ranker_for
from policies.logs import run_log
from policies.results import write_atomic
from policies.spec import RunSpec, SpecError, override_spec, parse_override, read_yaml
from runtime.errors import describe_exit
from runtime.lifetime import die_with_parent


@dataclass(frozen=True, slots=True)
class GridAxis:
    key: str
    values: tuple[Any, ...]


def parse_grid(text: str) -> GridAxis:
    """``key=v1,v2,...``: each value is read as YAML."""
    path, _ = parse_override(text.split(",")[0])
    raw = text.split("=", 1)[1]
    values = tuple(read_yaml(v) for v in raw.split(",") if v.strip())
    if not values:
        raise SpecError(f"grid {text!r} has no values")
    return GridAxis(".".join(path), values)


def grid_points(axes: list[GridAxis]) -> list[dict[str, Any]]:
    return [
        dict(zip([a.key for a in axes], combo))
        for combo in itertools.product(*(a.values for a in axes))
    ]


def point_spec(base: RunSpec, point: dict[str, Any]) -> RunSpec:
    overrides = [
        f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
        for k, v in point.items()
    ]
    return override_spec(base, overrides)


def run_point(base: RunSpec, point: dict[str, Any], out_dir: Path | None) -> dict[str, Any]:
    """Simulate one grid point; a failure becomes a row with its error, never an exception."""
    from sim.simulator import Simulation

    row: dict[str, Any] = dict(point)
    try:
        spec = point_spec(base, point)
        if out_dir is None:
            result = Simulation(spec, ranker=ranker_for(spec)).run()
        else:
            with run_log(out_dir):
                result = Simulation(spec, ranker=ranker_for(spec)).run()
                result.save(out_dir)
        row.update(result.metrics)
        row["error"] = None
    except Exception as err:  # noqa: BLE001 - one failing point must not lose the others
        row["error"] = f"{type(err).__name__}: {err}"
        row["traceback"] = traceback.format_exc(limit=3)
    return row


def _point_dir(out: Path, index: int) -> Path:
    return out / "points" / f"{index:04d}"


def _worker(conn, base_yaml: str, out: str, parent_pid: int) -> None:
    """A sweep worker: simulate the points it is sent, one at a time, until told to stop."""
    die_with_parent(parent_pid=parent_pid)
    base = RunSpec.model_validate(read_yaml(base_yaml))
    while (job := conn.recv()) is not None:
        index, point = job
        conn.send(("started", index, None))  # the point's clock starts now (not at spawn)
        conn.send(("done", index, run_point(base, point, _point_dir(Path(out), index))))


class _Pool:
    """``size`` worker processes; a point over its time is stopped with its worker."""

    def __init__(self, base: RunSpec, out: Path, size: int, timeout_s: float | None) -> None:
        self._ctx = mp.get_context("spawn")  # no fork of a process holding threads
        self._args = (base.to_yaml(), str(out), os.getpid())
        self.size, self.timeout_s = max(1, size), timeout_s
        # conn -> (process, index, start: None until the worker has started the point)
        self._busy: dict[Any, tuple[Any, int, float | None]] = {}
        self._idle: list[tuple[Any, Any]] = []  # (process, conn)

    def run(self, jobs: list[tuple[int, dict]], on_row) -> None:
        todo = list(reversed(jobs))
        try:
            while todo or self._busy:
                while todo and len(self._busy) < self.size:
                    self._submit(*todo.pop())
                for index, row in self._collect():
                    on_row(index, row)
        finally:
            self._close()

    def _submit(self, index: int, point: dict) -> None:
        process, conn = self._idle.pop() if self._idle else self._start()
        conn.send((index, point))
        self._busy[conn] = (process, index, None)

    def _start(self):
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_worker, args=(child, *self._args), daemon=True)
        process.start()  # from this (main) thread: the workers' parent-death signal follows it
        child.close()
        return process, parent

    def _collect(self) -> list[tuple[int, dict]]:
        ready = wait(list(self._busy), timeout=0.2)
        out = []
        for conn in ready:
            process, index, _ = self._busy.pop(conn)
            try:
                kind, _, row = conn.recv()
            except (EOFError, OSError):  # the worker died (killed, out of memory...)
                process.join(timeout=5)
                out.append((index, {"error": f"worker died: {describe_exit(process.exitcode)}"}))
                continue
            if kind == "started":
                self._busy[conn] = (process, index, time.monotonic())
            else:
                out.append((index, row))
                self._idle.append((process, conn))
        if self.timeout_s is not None:
            out += self._stop_overdue()
        return out

    def _stop_overdue(self) -> list[tuple[int, dict]]:
        now, out = time.monotonic(), []
        for conn, (process, index, start) in list(self._busy.items()):
            if start is not None and now - start > self.timeout_s:
                process.kill()
                process.join()
                del self._busy[conn]
                error = f"TimeoutError: point took over {self.timeout_s:g} s (stopped)"
                out.append((index, {"error": error}))
        return out

    def _close(self) -> None:
        for process, conn in self._idle:
            conn.send(None)
            process.join(timeout=5)
        for process, _, _ in self._busy.values():
            process.kill()
            process.join()


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


def _done_rows(out: Path, points: list[dict]) -> dict[int, dict]:
    rows = {}
    for i in range(len(points)):
        path = _point_dir(out, i) / "row.json"
        if path.exists():
            row = json.loads(path.read_text())
            if row.get("error") is None:
                rows[i] = row
    return rows


def run_sweep(
    base: RunSpec, axes: list[GridAxis], out: Path, workers: int = 2, quiet: bool = False,
    point_timeout_s: float | None = None,
) -> pd.DataFrame:  # fmt: skip
    points = grid_points(axes)
    out.mkdir(parents=True, exist_ok=True)
    _check_same_sweep(out, base, points)
    write_atomic(out / "spec.yaml", base.to_yaml().encode())
    rows = _done_rows(out, points)  # a resumed sweep skips the points already done

    def on_row(index: int, row: dict) -> None:
        row = {"point": index, **points[index], **row}
        rows[index] = row
        write_atomic(_point_dir(out, index) / "row.json", json.dumps(row, default=str).encode())
        bar.advance(task)

    with Progress(disable=quiet) as bar:
        task = bar.add_task("sweep", total=len(points), completed=len(rows))
        jobs = [(i, p) for i, p in enumerate(points) if i not in rows]
        _Pool(base, out, workers, point_timeout_s).run(jobs, on_row)
    frame = pd.DataFrame([rows[i] for i in sorted(rows)]).reset_index(drop=True)
    _save(frame, out)
    return frame


def _save(frame: pd.DataFrame, out: Path) -> None:
    import io

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    write_atomic(out / "results.parquet", buf.getvalue())
    write_atomic(out / "results.csv", frame.to_csv(index=False).encode())
