"""What a simulated run's GPUs cost: each group of GPUs for the time it was held.

Modelling assumptions: a generation instance holds its GPUs from the run's start or, added
by ``elastic``, from its ``ScaleOut`` (its engine start and weight load are paid for) to
its retirement (when its last request finished: ``sim.scaling``) or the run's end; the
trainer holds its GPUs for the whole run; a colocated mode's GPUs are counted once (as its
instances'). A GPU-second is priced by its hardware's ``cost_per_gpu_rel_h20``
(hardware.csv and the spec's ``sim.hardware``). Known bias: retired GPUs cost nothing from
that moment (no release delay, no minimum billing period).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sim.tables import Hardware


@dataclass(frozen=True, slots=True)
class GpuLease:
    """``num_gpus`` GPUs of ``hardware`` held from ``start_s`` to ``end_s`` (None: the end)."""

    hardware: str
    num_gpus: int
    start_s: float = 0.0
    end_s: float | None = None

    def held_s(self, run_end_s: float) -> tuple[float, float]:
        """When it was held in a run ending at ``run_end_s``: (taken, given back or the end)."""
        return self.start_s, run_end_s if self.end_s is None else min(self.end_s, run_end_s)

    def share_of_run(self, run_end_s: float) -> float:
        """The share of a run ending at ``run_end_s`` it was held (1.0 exactly: all of it)."""
        if run_end_s <= 0:
            return 1.0
        start_s, end_s = self.held_s(run_end_s)
        return max(0.0, end_s - start_s) / run_end_s


def mean_cost_units(
    leases: Iterable[GpuLease], run_end_s: float, price_per_gpu: Mapping[str, float | None]
) -> float | None:
    """The cost units held on average over the run (a fixed cluster: its cost): each
    lease's GPUs at their hardware's price, for the share of the run they were held; None
    where a price is unknown."""
    total = 0.0
    for lease in leases:
        price = price_per_gpu.get(lease.hardware)
        if price is None:
            return None
        total += price * lease.num_gpus * lease.share_of_run(run_end_s)
    return total


def mean_gpus(leases: Iterable[GpuLease], run_end_s: float) -> float:
    """GPUs held on average over the run."""
    return sum(lease.num_gpus * lease.share_of_run(run_end_s) for lease in leases)


def gpu_prices(table: Mapping[str, Hardware]) -> dict[str, float | None]:
    """Cost units a GPU-second of each hardware costs, held for a whole run
    (``policies.results.COST_UNIT``: 8 H20 GPUs are 1); None where the table has no price."""
    return {name: hw.cost_per_gpu_rel_h20 for name, hw in table.items()}
