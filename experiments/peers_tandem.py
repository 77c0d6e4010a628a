"""tandem's side of ``bench peers``: one live run of one pipeline mode, read back as a
:class:`~experiments.peers_rates.StepSeries`.

The run is ``tandem run SPEC --live`` in its own process (the command line a user runs,
engine start included), with the mode and the number of steps set on the command line.
Its step series comes from the run directory: each optimizer step's end time from
``steps.json``, the samples it trained and their completion tokens from
``samples.parquet`` (``train_step``, ``output_tokens``), and the whole run's window from
``metrics.json`` (``makespan_s``: the run's clock starts once its servers are up, before
the first weight load, and stops after the last step), and its CPU over that window from
``metrics.json``'s ``cpu_ms_per_sample`` (every process the run started: actor, trainer,
servers' frontends and engines).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from experiments.peers_rates import StepPoint, StepSeries
from policies.modes.base import MODES


def tandem_command(spec_path: Path, mode: str, steps: int, out_dir: Path) -> list[str]:
    """The command line of one live run of ``mode`` for ``steps`` optimizer steps.

    ``pipeline.max_lag`` is the lag of mode ``pipeline``; a mode whose bound is fixed
    runs at that bound (so a spec tuned for ``pipeline`` still runs every mode)."""
    fixed = MODES.get(mode).max_lag
    lag = ["--set", f"pipeline.max_lag={fixed}"] if fixed is not None else []
    return [
        sys.executable, "-m", "experiments.cli", "run", str(spec_path), "--live",
        "--set", f"pipeline.mode={mode}", *lag, "--set", f"run.iterations={steps}",
        "--out", str(out_dir),
    ]  # fmt: skip


def step_series(
    steps: list[dict], trained: dict[int, tuple[int, int, float]], end_s: float,
    cpu_ms_per_sample: float | None = None,
) -> StepSeries:  # fmt: skip
    """The series of a run: ``steps`` as in ``steps.json``, ``trained[step]`` = (samples,
    completion tokens, reward sum) trained by that step, ``end_s`` the run's makespan."""
    points = []
    for step in sorted(steps, key=lambda s: s["step"]):
        num_samples, num_tokens, reward_sum = trained.get(step["step"], (0, 0, 0.0))
        points.append(StepPoint(float(step["end_s"]), num_samples, num_tokens, reward_sum))
    num_samples = sum(p.num_samples for p in points)
    cpu_s = None if cpu_ms_per_sample is None else cpu_ms_per_sample * num_samples / 1000
    return StepSeries(0.0, end_s, tuple(points), cpu_s)


def read_run(run_dir: Path) -> StepSeries:
    """The step series of the live run in ``run_dir``."""
    import pandas as pd

    steps = json.loads((run_dir / "steps.json").read_text())
    metrics = json.loads((run_dir / "metrics.json").read_text())
    columns = ["train_step", "output_tokens", "reward"]
    samples = pd.read_parquet(run_dir / "samples.parquet", columns=columns)
    samples = samples.dropna(subset=["train_step"])
    per_step = samples.groupby("train_step").agg(
        count=("output_tokens", "count"), tokens=("output_tokens", "sum"), reward=("reward", "sum")
    )
    trained = {
        int(k): (int(row["count"]), int(row["tokens"]), float(row["reward"]))
        for k, row in per_step.iterrows()
    }
    return step_series(
        steps, trained, float(metrics["makespan_s"]), metrics.get("cpu_ms_per_sample")
    )
