"""least-loaded and skewness-aware pick from a heap: the same instance, ties included, as
the minimum over every instance that they took before."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from helpers import request, view

import policies.dispatch as dispatch
from policies.dispatch import LeastLoadedDispatch, SkewnessAwareDispatch
from policies.protocols import Device
from policies.records import InstanceView, Request


class RateCost:
    """H800 decodes a token twice as fast as H20; a step costs ``1 + batch``."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return (1.0 if device.hardware == "H800" else 2.0) * (1.0 + batch_size)


class LinearLoads:
    """The reference: a ``min`` over the group by (load…, position)."""

    def __init__(
        self, instances: Sequence[InstanceView], weights: dict[int, float] | None = None
    ) -> None:
        self.tokens = {v.instance_id: v.assigned_tokens for v in instances}
        self.count = {v.instance_id: v.num_assigned for v in instances}
        self._weights = weights

    def lightest(self, ids: list[int]) -> int:
        return ids[min(range(len(ids)), key=lambda k: (*self._load(ids[k]), k))]

    def _load(self, instance_id: int) -> tuple[float, float]:
        w = 1.0 if self._weights is None else self._weights[instance_id]
        return self.tokens[instance_id] * w, self.count[instance_id] * w

    def add(self, instance_id: int, request: Request) -> None:
        self.tokens[instance_id] += request.predicted_tokens or 0.0
        self.count[instance_id] += 1


def _case(seed: int) -> tuple[list[InstanceView], list[Request]]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 24))
    views = [
        view(
            int(i),
            max_num_seqs=int(rng.choice([4, 8])),
            hardware=str(rng.choice(["H800", "H20"])),
            num_assigned=int(rng.integers(0, 3)),
            assigned_tokens=float(rng.choice([0.0, 10.0, 20.0])),
        )
        for i in rng.permutation(n)  # ids in no order: positions are not ids
    ]
    preds = [None if rng.random() < 0.2 else float(rng.choice([0, 5, 10, 50])) for _ in range(80)]
    return views, [request(i, p) for i, p in enumerate(preds)]


@pytest.mark.parametrize("seed", range(40))
def test_heap_picks_what_the_linear_minimum_picked(seed, monkeypatch):
    views, requests = _case(seed)
    make = {
        "least-loaded": lambda: LeastLoadedDispatch(RateCost()),
        "least-loaded-one-shape": lambda: LeastLoadedDispatch(None),
        "skewness-sum": lambda: SkewnessAwareDispatch(RateCost(), "sum"),
        "skewness-max": lambda: SkewnessAwareDispatch(RateCost(), "max", 0.3),
    }
    for name, policy in make.items():
        batches = [requests[:40], requests[40:41], requests[41:]]  # a batch, one, the rest
        heap, linear = policy(), policy()
        got = [heap.assign(b, views) for b in batches]
        with monkeypatch.context() as m:
            m.setattr(dispatch, "_Loads", LinearLoads)
            want = [linear.assign(b, views) for b in batches]
        assert got == want, name


def test_with_prediction_is_replace_with_every_field_passed_on():
    import dataclasses

    r = Request(1, 2, 3, 4, 5, 6, None, "a prompt")
    assert r.with_prediction(7.5) == dataclasses.replace(r, predicted_tokens=7.5)
    assert [f.name for f in dataclasses.fields(Request)] == [
        "sample_id", "prompt_id", "group_id", "iteration", "prompt_tokens", "max_tokens",
        "predicted_tokens", "prompt",
    ]  # fmt: skip
