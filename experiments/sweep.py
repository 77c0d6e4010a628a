"""Parameter sweeps: every combination of a grid, simulated in parallel processes."""

from __future__ import annotations

import itertools
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from rich.progress import Progress

from experiments.predictors import ranker_for
from policies.results import write_atomic
from policies.spec import RunSpec, SpecError, override_spec, parse_override
from sim.simulator import Simulation


@dataclass(frozen=True, slots=True)
class GridAxis:
    key: str
    values: tuple[Any, ...]


def parse_grid(text: str) -> GridAxis:
    """``key=v1,v2,...``: each value is read as YAML."""
    path, _ = parse_override(text.split(",")[0])
    raw = text.split("=", 1)[1]
    values = tuple(yaml.safe_load(v) for v in raw.split(",") if v.strip())
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
    row: dict[str, Any] = dict(point)
    try:
        spec = point_spec(base, point)
        result = Simulation(spec, ranker=ranker_for(spec)).run()
        if out_dir is not None:
            result.save(out_dir)
        row.update(result.metrics)
        row["error"] = None
    except Exception as err:  # noqa: BLE001 - one failing point must not lose the others
        row["error"] = f"{type(err).__name__}: {err}"
        row["traceback"] = traceback.format_exc(limit=3)
    return row


def run_sweep(
    base: RunSpec, axes: list[GridAxis], out: Path, workers: int = 2, quiet: bool = False
) -> pd.DataFrame:
    points = grid_points(axes)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "spec.yaml", base.to_yaml().encode())
    rows: list[dict[str, Any]] = []
    with Progress(disable=quiet) as bar, ProcessPoolExecutor(max_workers=workers) as pool:
        task = bar.add_task("sweep", total=len(points))
        futures = {
            pool.submit(run_point, base, p, out / "points" / f"{i:04d}"): i
            for i, p in enumerate(points)
        }
        for fut in as_completed(futures):
            rows.append({"point": futures[fut], **fut.result()})
            bar.advance(task)
    frame = pd.DataFrame(rows).sort_values("point").reset_index(drop=True)
    _save(frame, out)
    return frame


def _save(frame: pd.DataFrame, out: Path) -> None:
    import io

    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    write_atomic(out / "results.parquet", buf.getvalue())
    write_atomic(out / "results.csv", frame.to_csv(index=False).encode())
