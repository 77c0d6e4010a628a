"""How ``tandem run``'s summary table writes a metric, and why a metric it shows as "—"
has no value."""

from __future__ import annotations

from typing import Any

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
    from sim.tables import hardware_of, hardware_without_cost

    names = [pool.hardware for pool in spec.cluster.generation] + [spec.cluster.trainer.hardware]
    missing = hardware_without_cost(names, hardware_of(spec))
    if not missing:
        return None
    return (
        f"cost_normalized_throughput {MISSING}: hardware.csv has no cost_per_machine_rel_h20 "
        f"for {', '.join(missing)} (sim.hardware can give it)"
    )
