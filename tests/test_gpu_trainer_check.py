"""``scripts/gpu_trainer_check.py`` keeps working: its dry run on this host's CPU (the same
checks without compile, NCCL or the 0.5B timing) passes, its comparison fails on
weights that differ, and without a CUDA device it says so."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_trainer_check.py"


def _run(out: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(out)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TANDEM_CHECK_DEVICE": "cpu", **env},
    )  # fmt: skip


def test_the_dry_run_passes_every_check(tmp_path):
    done = _run(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "gpu_trainer_check.json").read_text())
    checks = {k: v for k, v in results.items() if isinstance(v, dict)}
    assert set(checks) == {"cpu-vs-cuda", "sharded", "push-gloo"}
    assert all(v["ok"] for v in checks.values())
    assert checks["push-gloo"]["max_diff"] == 0.0
    assert len(checks["sharded"]["losses"][0]) == 3


def test_a_device_it_cannot_use_is_reported(tmp_path):
    done = _run(tmp_path, TANDEM_CHECK_DEVICE="cuda", CUDA_VISIBLE_DEVICES="")
    assert done.returncode == 2
    assert "no CUDA device here" in done.stdout


def test_the_comparison_fails_on_weights_or_losses_that_differ():
    spec = importlib.util.spec_from_file_location("gpu_trainer_check", SCRIPT)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    a = {"losses": [1.0, 2.0], "weights": {"w": torch.zeros(3)}}
    near = {"losses": [1.0, 2.0 + 1e-6], "weights": {"w": torch.full((3,), 1e-6)}}
    assert check.compare(a, near, 1e-4)["ok"]
    moved = {"losses": [1.0, 2.0], "weights": {"w": torch.tensor([0.0, 0.0, 1e-3])}}
    assert not check.compare(a, moved, 1e-4)["ok"]
    assert check.compare(a, moved, 1e-4)["max_weight_diff"] == torch.tensor(1e-3).item()
    assert not check.compare(a, {**near, "losses": [1.0, 2.1]}, 1e-4)["ok"]
