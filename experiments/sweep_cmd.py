"""The ``tandem sweep`` command: its arguments, and the sweep from a loaded spec to ``--out``.

Heavy imports (the simulator, pandas, Ray) happen inside :func:`run_sweep_command`, so
that building the CLI's parser stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from experiments.arg_types import path_text, positive_float, positive_int, ray_address
from experiments.guards import check_out_dir
from policies.spec import RunSpec, SpecError
from runtime.ray_session import LOCAL_RAY

if TYPE_CHECKING:
    import pandas as pd

    from experiments.sweep import SweepResult


def add_sweep_parser(
    sub: Any,
    with_spec: Callable[[argparse.ArgumentParser, str | None], None],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    sweep = sub.add_parser("sweep", help="simulate every combination of a grid")
    with_spec(sweep, None)
    sweep.add_argument(
        "--grid",
        action="append",
        required=True,
        metavar="KEY=V1,V2",
        help="one axis of the grid: a spec key and its values (repeat for more axes, which "
        "form every combination); linked keys vary together, a value per key joined by ':', "
        "e.g. cluster.generation.0.num_gpus,cluster.trainer.num_gpus=8:24,16:16,24:8; "
        "pipeline.max_lag=null,1,4 gives each mode that fixes its lag a point at its own",
    )
    sweep.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        help="simulation processes (default 2); with --ray, the CPUs of the Ray instance it "
        "starts (default: this machine's cores), or the most points at once on a cluster",
    )
    sweep.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL_RAY,
        type=ray_address,
        default=None,
        metavar="ADDRESS",
        help="run each point as a Ray task: on a Ray instance started for the sweep on "
        "127.0.0.1, or on the cluster at ADDRESS (auto or host:port; tandem installed on its "
        "nodes); needs pip install 'tandem-rl[ray]'",
    )
    sweep.add_argument(
        "--point-timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="seconds a point may take before it is stopped and recorded as failed",
    )
    sweep.add_argument(
        "--skip-invalid",
        action="store_true",
        help="leave out the grid's points the spec refuses (listed in left_out.csv) instead "
        "of refusing the sweep",
    )
    sweep.add_argument(
        "--out",
        type=path_text,
        required=True,
        help="directory for results.csv/.parquet and points/; a second run resumes (skips done points)",
    )
    sweep.set_defaults(func=handler)


def check_untracked(spec: RunSpec, grid_keys: list[str]) -> None:
    """A sweep tracks no point (its record is ``results.csv``); a ``run.tracking`` it was
    given is refused rather than silently ignored."""
    if spec.run.tracking != "none" or "run.tracking" in grid_keys:
        raise SpecError(
            "run.tracking: a sweep does not track its points (results.csv holds every "
            "point's metrics); leave run.tracking at none, or track a point with tandem run"
        )


def run_sweep_command(spec: RunSpec, args: argparse.Namespace, console: Console) -> int:
    """Run the sweep; print its outcome. Exit status 0, 1 if a point failed, 2 if every
    point's spec was invalid. A Ctrl-C (or SIGTERM) once every point has run stops nothing
    (it says so): the sweep is complete and exits as such."""
    from experiments.sweep import grid_points, parse_grid, run_sweep
    from experiments.sweep_point import check_point_specs
    from policies.logs import noted_warnings

    axes = [parse_grid(g) for g in args.grid]
    points = grid_points(axes)  # a repeated key or value is refused before --out is made
    check_untracked(spec, [key for axis in axes for key in axis.keys])
    # so is an impossible point (unless left out), before any point runs
    with noted_warnings() as warned:  # said once here; the points' runs keep them quiet
        left_out = check_point_specs(spec, points, args.skip_invalid, args.set)
    out = check_out_dir(args.out)
    result = run_sweep(
        spec, axes, out, args.workers, point_timeout_s=args.point_timeout,
        ray_address=args.ray, left_out=left_out, warned=warned,
    )  # fmt: skip
    code, in_report = _exit_code(result.frame), False
    try:  # every point has run: a Ctrl-C from here on stops nothing but this report
        # the plot: one key an axis (a linked key moves with its axis's first)
        _report(result, left_out, len(points), [a.keys[0] for a in axes], out, console)
    except KeyboardInterrupt:
        in_report = True
    if result.stopped_after_last or in_report:
        frame = result.frame
        missing = " (summary.png may be missing)" if in_report else ""
        console.print(
            f"[yellow]interrupted after every point had run[/yellow] ({len(frame)} points, "
            f"{frame['error'].notna().sum()} failed): nothing was left to stop, the sweep is "
            f"complete; results in [bold]{out}[/bold]{missing}"
        )
    return code


def _exit_code(frame: pd.DataFrame) -> int:
    """0; 1 if a point failed; 2 if every point's spec was invalid."""
    failed = frame["error"].notna().sum()
    if failed == len(frame) and frame["error"].str.startswith("SpecError").all():
        return 2
    return 1 if failed else 0


def _report(
    result: SweepResult, left_out: dict[int, str], num_points: int, keys: list[str], out: Path,
    console: Console,
) -> None:  # fmt: skip
    """The points left out, summary.png, the sweep's one-line outcome and each failed
    point's error."""
    from experiments.plots import sweep_summary

    if left_out:
        console.print(
            f"{len(left_out)} of {num_points} points left out (the spec refuses them; "
            f"left_out.csv says why), e.g. point {next(iter(left_out))}: "
            f"{next(iter(left_out.values()))}"
        )
    frame = result.frame
    failed = frame["error"].notna().sum()
    if failed < len(frame):
        sweep_summary(frame, keys, out / "summary.png")
    done = f" ({result.num_already_done} already done)" if result.num_already_done else ""
    console.print(f"{len(frame)} points{done}, {failed} failed; results in [bold]{out}[/bold]")
    for _, row in frame[frame["error"].notna()].iterrows():
        console.print(f"[red]point {row['point']} failed[/red]: {row['error']}")
