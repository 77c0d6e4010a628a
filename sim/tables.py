"""The hardware table (a copy of the published facts in shared/data); models: ``sim.models``."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path


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


def hardware_without_cost(names: Iterable[str]) -> list[str]:
    """Those of ``names`` that hardware.csv gives no ``cost_per_machine_rel_h20`` (or no
    row), each once, in order: what keeps a run from ``cost_normalized_throughput``."""
    table = hardware_table()
    missing = [n for n in names if n not in table or table[n].cost_per_gpu_rel_h20 is None]
    return list(dict.fromkeys(missing))


def hardware(name: str) -> Hardware:
    table = hardware_table()
    if name not in table:
        raise ValueError(f"unknown hardware {name!r}; hardware.csv has {', '.join(table)}")
    return table[name]
