"""How ``tandem run``'s summary table writes a metric, why a metric it shows as "—"
has no value, and how well the run's ranker ranked (where it had one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from experiments.ranker_quality import brief as brief_ranker
from policies.results import SPLIT_METRICS, SUMMARY_METRICS, RunResult
from policies.spec import RunSpec

MISSING = "—"


def format_metric(value: float | int | None) -> str:
    """A count as an integer (``10240``, never ``1.024e+04``); another number with four
    significant digits, one decimal from 1000 up and in e-notation only below 0.001."""
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:d}"
    size = abs(value)
    if size >= 1000:
        return f"{value:.1f}"
    if size >= 1e-3 or value == 0:
        return f"{value:.4g}"
    return f"{value:.3e}"


def cost_note(spec: RunSpec, metrics: dict[str, Any]) -> str | None:
    """Why ``cost_normalized_throughput`` is missing, in one line; None when it is not."""
    if metrics.get("cost_normalized_throughput") is not None:
        return None
    if "sim_wall_s" not in metrics:
        return "cost_normalized_throughput: a live run is not priced (the simulator's only)"
    from experiments.cost_hint import cost_hint
    from sim.tables import hardware_of, hardware_without_cost

    names = [pool.hardware for pool in spec.cluster.generation] + [spec.cluster.trainer.hardware]
    missing = hardware_without_cost(names, hardware_of(spec))
    if not missing:
        return None
    return (
        f"cost_normalized_throughput {MISSING}: hardware.csv and sim.hardware have no "
        f"cost_per_machine_rel_h20 for {', '.join(missing)} (give it with {cost_hint(spec, missing)})"
    )


def print_summary(result: RunResult, out: Path, console: Console) -> None:
    """``tandem run``'s closing table of :data:`SUMMARY_METRICS` (and, simulated, the split
    that ran: :data:`SPLIT_METRICS`), with why a metric is missing, the ranker's quality (a
    run whose length predictor is a ranker), the cost model that priced a simulated run, and
    where the results are."""
    table = Table(title=f"{result.spec.run.name} · {result.spec.pipeline.mode}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in SUMMARY_METRICS:
        table.add_row(key, format_metric(result.metrics.get(key)))
    for key in [m.name for m in SPLIT_METRICS if m.name in result.metrics]:  # simulated
        table.add_row(key, format_metric(result.metrics[key]))
    console.print(table)
    if note := cost_note(result.spec, result.metrics):
        console.print(note)
    if "ranker_num_iterations" in result.metrics:  # experiments.ranker_quality measured it
        console.print(brief_ranker(result.metrics), markup=False)
    if "sim_wall_s" in result.metrics:
        from sim.costs import describe_cost_model

        console.print(f"cost model: {describe_cost_model(result.spec)}")
    console.print(f"results in [bold]{out}[/bold]")
