"""Benchmark: ``tandem advise`` against the exhaustive grid, on the StreamRL specs at 20K.

    python -m experiments.advise_bench [streamrl-7b ...] [--budget-s 60] [--workers 2]

For each spec it checks that the grid fixture (``experiments.advise_grid``) still matches
the simulator (stops with the command to regenerate it otherwise), runs ``advise`` on the
same space with the budget, and prints, side by side: the throughput advise found and
the grid's best, the simulations each needed (the grid: every candidate in full plus its
short run; advise: its short and full runs, pricing included, and full-run equivalents),
and the wall time. ``--default-space`` also runs advise on its full default space (a
superset of the grid's) against the same grid best. The last line printed is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.advise import AdviseOptions, advise
from experiments.advise_grid import (
    BENCH_AXES,
    BENCH_SPECS,
    FixtureStale,
    bench_spec,
    check_fixture,
    load_fixture,
)
from experiments.advise_plan import SpaceOptions


def bench_one(name: str, budget_s: float, workers: int, axes: tuple[str, ...]) -> dict[str, Any]:
    fixture = load_fixture(name)
    check_fixture(fixture)
    start = time.monotonic()
    advice = advise(bench_spec(name), AdviseOptions(SpaceOptions(axes=axes), budget_s, workers))
    wall_s = time.monotonic() - start
    full = advice.space.base.run.iterations
    grid_sims = int(
        fixture.frame["full_iterations"].notna().sum()
        + fixture.frame["short_iterations"].notna().sum()
    )
    return {
        "spec": name,
        "space": "grid" if axes == BENCH_AXES else "default",
        "candidates": len(advice.space.candidates),
        "found": advice.best_value,
        "grid_best": fixture.best_value,
        "found_over_grid": advice.best_value / fixture.best_value,
        "advise_sims": advice.num_simulations,
        "advise_search_sims": len(advice.result.evaluations),
        "advise_full_equiv": round(sum(e.iterations for e in advice.evaluations) / full, 1),
        "grid_candidates": int(fixture.meta["num_candidates"]),
        "grid_sims": grid_sims,
        "grid_cpu_s": fixture.meta["cpu_s"],
        "advise_wall_s": round(wall_s, 1),
        "finished": advice.result.finished,
        "coverage": round(advice.result.coverage, 4),
        "advice": advice.best.label(advice.space.inventory),
    }


def print_table(rows: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="tandem advise vs the exhaustive grid (StreamRL specs, 20K tokens)")
    for col in ("spec", "space", "found", "grid best", "found/grid", "advise sims",
                "grid sims", "advise wall s", "grid cpu s", "covered"):  # fmt: skip
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["spec"], r["space"], f"{r['found']:.4g}", f"{r['grid_best']:.4g}",
            f"{r['found_over_grid']:.4f}", f"{r['advise_sims']} ({r['advise_full_equiv']} full-eq)",
            f"{r['grid_sims']} ({r['grid_candidates']} full)", f"{r['advise_wall_s']}",
            f"{r['grid_cpu_s']}", f"{r['coverage']:.0%}{'' if r['finished'] else ' (budget)'}",
        )  # fmt: skip
    console.print(table)
    for r in rows:
        console.print(f"{r['spec']} ({r['space']}): {r['advice']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.advise_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("names", nargs="*", help=f"default: {' '.join(BENCH_SPECS)}")
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--default-space", action="store_true", help="also advise on the default space"
    )
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(BENCH_SPECS)
    if unknown:
        parser.error(
            f"unknown spec(s) {', '.join(sorted(unknown))}; choose from {', '.join(BENCH_SPECS)}"
        )
    console = Console()
    rows = []
    try:
        for name in args.names or BENCH_SPECS:
            rows.append(bench_one(name, args.budget_s, args.workers, BENCH_AXES))
            if args.default_space:
                rows.append(bench_one(name, args.budget_s, args.workers, ()))
    except FixtureStale as err:
        console.print(f"[red]{err}[/red]")
        return 2
    print_table(rows, console)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
