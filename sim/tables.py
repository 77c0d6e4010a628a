"""The hardware table (a copy of the published facts in shared/data); models: ``sim.models``."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policies.sim_section import HardwareRow
    from policies.spec import RunSpec


@dataclass(slots=True, frozen=True)
class Hardware:
    name: str
    bf16_flops: float  # FLOP/s, dense
    hbm_bytes: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    # machine cost / 8 GPUs, in H20-machine units: an H20 GPU is 0.125, never 1
    cost_per_gpu_rel_h20: float | None


def data_path(name: str) -> Path:
    return Path(str(resources.files("sim") / "data" / name))


def _rows(name: str) -> list[dict[str, str]]:
    with data_path(name).open() as f:
        return list(csv.DictReader(f))


@cache
def hardware_table() -> dict[str, Hardware]:
    out = {}
    for r in _rows("hardware.csv"):
        cost = r["cost_per_machine_rel_h20"]
        out[r["name"]] = Hardware(
            name=r["name"],
            bf16_flops=float(r["bf16_dense_tflops"]) * 1e12,
            hbm_bytes=float(r["hbm_gb"]) * 1e9,
            hbm_bytes_per_s=float(r["hbm_tb_per_s"]) * 1e12,
            nvlink_bytes_per_s=float(r["nvlink_gb_per_s"]) * 1e9,
            cost_per_gpu_rel_h20=float(cost) / 8 if cost else None,
        )
    return out


PERFORMANCE = ("bf16_dense_tflops", "hbm_gb", "hbm_tb_per_s", "nvlink_gb_per_s")


def hardware_of(spec: RunSpec) -> dict[str, Hardware]:
    """hardware.csv with the spec's own rows (``sim.hardware``): a new GPU needs every
    figure of :data:`PERFORMANCE`; for a listed one, the figures given replace its own."""
    table = dict(hardware_table())
    for i, row in enumerate(spec.sim.hardware):
        base = table.get(row.name)
        if base is None and (missing := [f for f in PERFORMANCE if getattr(row, f) is None]):
            raise ValueError(
                f"sim.hardware.{i}.{missing[0]}: {row.name!r} is not in hardware.csv, so "
                f"{', '.join(missing)} must be given (hardware.csv has {', '.join(table)})"
            )
        table[row.name] = _with_row(base, row)
    return table


def _with_row(base: Hardware | None, row: HardwareRow) -> Hardware:
    """``base`` (None: a new GPU, every figure given) with ``row``'s figures."""

    def pick(given: float | None, scale: float, current: float | None) -> float:
        value = given * scale if given is not None else current
        assert value is not None  # hardware_of checked a new GPU gives every figure
        return value

    cost = row.cost_per_machine_rel_h20
    return Hardware(
        name=row.name,
        bf16_flops=pick(row.bf16_dense_tflops, 1e12, base and base.bf16_flops),
        hbm_bytes=pick(row.hbm_gb, 1e9, base and base.hbm_bytes),
        hbm_bytes_per_s=pick(row.hbm_tb_per_s, 1e12, base and base.hbm_bytes_per_s),
        nvlink_bytes_per_s=pick(row.nvlink_gb_per_s, 1e9, base and base.nvlink_bytes_per_s),
        cost_per_gpu_rel_h20=cost / 8 if cost is not None else base and base.cost_per_gpu_rel_h20,
    )


def hardware_without_cost(
    names: Iterable[str], table: Mapping[str, Hardware] | None = None
) -> list[str]:
    """Those of ``names`` that ``table`` (default hardware.csv) gives no
    ``cost_per_machine_rel_h20`` (or no row), each once, in order: what keeps a run from
    ``cost_normalized_throughput``."""
    table = hardware_table() if table is None else table
    missing = [n for n in names if n not in table or table[n].cost_per_gpu_rel_h20 is None]
    return list(dict.fromkeys(missing))


def hardware(name: str) -> Hardware:
    table = hardware_table()
    if name not in table:
        raise ValueError(f"unknown hardware {name!r}; hardware.csv has {', '.join(table)}")
    return table[name]
