"""Shared builders for the foundation tests: specs, fake prompt sources, views, completions."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from policies.dispatch import DISPATCH
from policies.modes import MODES, WaveController
from policies.predictors import PREDICTORS
from policies.records import Completion, FinishReason, InstanceView, Request
from policies.results import METRIC_NAMES, SIM_METRICS, WALL_METRICS
from policies.scheduling import SCHEDULING
from policies.spec import RunSpec, spec_from_dict

METRICS_KEYS = {*METRIC_NAMES, *SIM_METRICS}  # what every simulated metrics.json holds
SAMPLE_COLUMNS = [
    "sample_id",
    "prompt_id",
    "group_id",
    "iteration",
    "instance_id",
    "prompt_tokens",
    "output_tokens",
    "predicted_output_tokens",
    "dispatch_s",
    "gen_start_s",
    "gen_end_s",
    "train_step",
    "version_start",
    "version_end",
    "version_trained",
    "reward",
    "version_prompt",
    "completion_text",
    "completion_token_ids",
]
SPAN_COLUMNS = ["resource", "kind", "start_s", "end_s", "iteration", "batch_size"]

# from the registries: a new mode or policy is tested without editing these lists
WAVE_MODES = [name for name, t in MODES.items() if t.controller is WaveController]
ALL_MODES = MODES.names()
# the bound of every mode that fixes one (conventional at the default steps_per_generation)
STALENESS_BOUND = {name: t.fixed_lag(1) for name, t in MODES.items() if t.fixed_lag(1) is not None}
DISPATCHES = DISPATCH.names()
SCHEDULINGS = SCHEDULING.names()
SIM_PREDICTORS = [n for n in PREDICTORS.names() if n != "ranker"]  # ranker: fitted by callers

# A small simulated run: 7B on H800, a handful of samples per step.
SMALL: dict[str, Any] = {
    "run.iterations": 2,
    "run.seed": 0,
    "cluster.generation.0.num_gpus": 2,
    "cluster.generation.0.max_num_seqs": 64,
    "cluster.trainer.num_gpus": 2,
    "workload.kind": "lognormal",
    "workload.max_output_tokens": 500,
    "workload.lognormal_median_tokens": 150.0,
    "workload.num_prompts": 64,
    "algorithm.name": "grpo",
    "algorithm.batch_size": 8,
    "algorithm.group_size": 2,
    "policies.allocation": "fixed",
}


def set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b.0.c`` in nested dicts/lists (list items by index)."""
    node: Any = data
    parts = dotted.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    last = parts[-1]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def make_spec(
    overrides: dict[str, Any] | None = None, base: dict[str, Any] | None = None
) -> RunSpec:
    """The default spec with ``base`` then ``overrides`` (dotted keys, Python values) applied."""
    data = RunSpec().model_dump(mode="json")
    for key, value in {**(base or {}), **(overrides or {})}.items():
        set_path(data, key, copy.deepcopy(value))
    return spec_from_dict(data)


def small_spec(**overrides: Any) -> RunSpec:
    """``SMALL`` with overrides given as ``section__key=value`` (``__`` stands for ``.``)."""
    return make_spec({k.replace("__", "."): v for k, v in overrides.items()}, base=SMALL)


def view(instance_id: int, max_num_seqs: int = 256, **kw: Any) -> InstanceView:
    return InstanceView(
        instance_id=instance_id,
        hardware=kw.pop("hardware", "H800"),
        tp=kw.pop("tp", 1),
        datacenter=kw.pop("datacenter", "dc0"),
        max_num_seqs=max_num_seqs,
        kv_capacity_tokens=kw.pop("kv_capacity_tokens", 10**6),
        **kw,
    )


def request(
    sample_id: int,
    predicted: float | None = None,
    iteration: int = 0,
    prompt_tokens: int = 10,
    max_tokens: int = 1000,
    group_size: int = 1,
) -> Request:
    return Request(
        sample_id=sample_id,
        prompt_id=sample_id // group_size,
        group_id=sample_id // group_size,
        iteration=iteration,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        predicted_tokens=predicted,
    )


class FreeCost:
    """A cost model stand-in whose prefill, training and weight transfer are free; a
    subclass says what a decode step costs."""

    def decode_step_s(self, device: Any, batch_size: int, context_tokens: int) -> float:
        raise NotImplementedError

    def prefill_s(self, device: Any, num_tokens: int) -> float:
        return 0.0

    def train_s(self, device: Any, num_tokens: int, num_micro_batches: int = 1) -> float:
        return 0.0

    def weight_transfer_s(self, num_bytes: float, gbps: float, latency_s: float) -> float:
        return 0.0


class FakePrompts:
    """A ``PromptSource``: iteration i holds samples i·B … i·B+B−1, groups of ``group_size``."""

    def __init__(self, batch_size: int, group_size: int) -> None:
        self.batch_size = batch_size
        self.group_size = group_size
        self.calls: list[int] = []

    def request(self, sample_id: int, predicted: float | None = None) -> Request:
        return Request(
            sample_id=sample_id,
            prompt_id=sample_id // self.group_size,
            group_id=sample_id // self.group_size,
            iteration=sample_id // self.batch_size,
            prompt_tokens=10,
            max_tokens=100,
            predicted_tokens=predicted,
        )

    def batch(self, iteration: int) -> list[Request]:
        self.calls.append(iteration)
        first = iteration * self.batch_size
        return [self.request(i) for i in range(first, first + self.batch_size)]


class FakePredictor:
    """Predicts ``10 × (sample_id + 1)`` tokens."""

    def fit(self, requests: Sequence[Request], output_tokens: Sequence[int]) -> None:
        pass

    def predict(self, requests: Sequence[Request]) -> list[float | None]:
        return [10.0 * (r.sample_id + 1) for r in requests]


def completion(
    req: Request,
    instance_id: int,
    end_s: float,
    version_start: int = 0,
    version_end: int | None = None,
    output_tokens: int = 5,
) -> Completion:
    return Completion(
        request=req,
        instance_id=instance_id,
        output_tokens=output_tokens,
        finish_reason=FinishReason.STOP,
        version_start=version_start,
        version_end=version_start if version_end is None else version_end,
        dispatch_s=0.0,
        gen_start_s=0.0,
        gen_end_s=end_s,
    )


def metrics_without_wall(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k not in WALL_METRICS}


TINY_OPERATORS: dict[str, tuple[list[str], list[float]]] = {
    "decode": (["1", "n", "ctx"], [0.008, 2e-4, 1e-7]),
    "prefill": (["1", "tokens"], [0.02, 1e-4]),
    "forward": (["1", "tokens"], [0.01, 5e-5]),
    "backward": (["1", "tokens"], [0.01, 8e-5]),
    "optimizer": (["1"], [0.012]),
    "weight_transfer": (["1"], [0.2]),
    "weight_pause": (["1"], [0.1]),
}


def write_cost_model(path: Path, **operators: tuple[list[str], list[float]]) -> Path:
    """A ``cost_model.json`` under ``path``: :data:`TINY_OPERATORS`, with ``operators``
    (name -> (bases, coefficients)) added or replacing them."""
    ops = {**TINY_OPERATORS, **operators}
    doc = {
        "format": "tandem-cost-model", "version": 1, "weight_bytes": 1e6,
        "kv_capacity_tokens": 100000,
        "operators": {k: {"bases": b, "coefs": c, "heldout_mape": 0.0} for k, (b, c) in ops.items()},
    }  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    (path / "cost_model.json").write_text(json.dumps(doc))
    return path


# A small spec file for the CLI (sweeps, runs): 7B on H800, two iterations of 8 samples.
SMALL_YAML = """
run: {name: tiny, iterations: 2, seed: 3}
cluster:
  generation: [{hardware: H800, num_gpus: 2, max_num_seqs: 32}]
  trainer: {hardware: H800, num_gpus: 2}
workload: {kind: lognormal, max_output_tokens: 300, lognormal_median_tokens: 80, num_prompts: 32}
algorithm: {name: grpo, batch_size: 8, group_size: 2}
pipeline: {mode: disagg-sync}
policies: {allocation: fixed}
"""

# The tandem command as its console script runs it (``main()`` imported and called), for
# tests that stop it with a signal. Started as ``python -m experiments.cli``, a run whose
# SIGTERM handler had unwound it and printed "terminated" then died by SIGINT instead of
# exiting 143 in about 1 run of 25 here (CPython's -m path; not in 175 runs this way).
TANDEM = [sys.executable, "-c", "import sys; from experiments.cli import main; sys.exit(main())"]


def write_profile(path: Path, setup: dict[str, Any], **info: Any) -> dict[str, Any]:
    """A consistent ``tandem profile`` directory at ``path`` (tables and profile.json, the
    setup it measured ``setup``); ``info`` replaces profile.json keys (None removes one)."""
    tokens = np.array([20, 60, 120, 250, 400, 800])
    pd.DataFrame(
        {"batch_size": [1, 4, 10, 20, 40, 64], "context_tokens": [20, 90, 300, 700, 1400, 2500],
         "step_s": [0.008, 0.009, 0.011, 0.013, 0.018, 0.024]}
    ).to_csv(path / "decode.csv", index=False)  # fmt: skip
    pd.DataFrame({"num_tokens": tokens, "prefill_s": 0.02 + 1e-4 * tokens}).to_csv(
        path / "prefill.csv", index=False
    )
    pd.DataFrame(
        {"num_tokens": tokens, "forward_s": 0.01 + 5e-5 * tokens,
         "backward_s": 0.015 + 8e-5 * tokens, "optimizer_s": [0.012] * 6}
    ).to_csv(path / "train.csv", index=False)  # fmt: skip
    pd.DataFrame({"num_bytes": [1e6] * 4, "transfer_s": [0.2] * 4, "pause_s": [0.12] * 4}).to_csv(
        path / "weight_sync.csv", index=False
    )
    profile = {"weight_bytes": 1e6, "kv_capacity_tokens": 100000, **setup, **info}
    profile = {k: v for k, v in profile.items() if v is not None}
    (path / "profile.json").write_text(json.dumps(profile))
    return profile
