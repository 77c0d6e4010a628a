"""The policies' declarations of whether they read predicted lengths (``READS_LENGTHS`` in
``policies.dispatch`` and ``policies.scheduling``), checked against what each registered
policy does: one that declares it reads none decides alike whatever the predictions."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import request, view

from policies import dispatch, scheduling
from policies.dispatch import DISPATCH
from policies.inert_keys import inert_keys
from policies.length_readers import reads_lengths
from policies.scheduling import SCHEDULING
from policies.spec import RunSpec


class _Cost:
    def decode_step_s(self, device: object, batch_size: int, context_tokens: int) -> float:
        return 1.0 + batch_size


PREDICTIONS = ([None] * 8, [float(n) for n in (900, 10, 10, 10, 800, 10, 700, 10)])


def _assignments(name: str, predicted: list[float | None]) -> list[int]:
    offered = {"rng": np.random.default_rng(0), "cost_model": _Cost(), "objective": "sum",
               "long_tail_fraction": 0.2}  # fmt: skip
    policy = DISPATCH.create_from(name, offered)
    views = [view(0, assigned_tokens=500.0, num_assigned=1), view(1), view(2)]
    return policy.assign([request(i, p) for i, p in enumerate(predicted)], views)


@pytest.mark.parametrize("name", DISPATCH.names())
def test_a_dispatch_reads_predicted_lengths_as_it_declares(name):
    without, with_lengths = (_assignments(name, p) for p in PREDICTIONS)
    assert (without != with_lengths) == (name in dispatch.READS_LENGTHS)


@pytest.mark.parametrize("name", SCHEDULING.names())
def test_a_scheduling_reads_predicted_lengths_as_it_declares(name):
    policy = SCHEDULING.create(name)
    priorities = {policy.priority(request(0, p)) for p in (None, 10.0, 900.0)}
    assert (len(priorities) > 1) == (name in scheduling.READS_LENGTHS)


def test_reads_lengths_by_either_policy_and_not_by_a_moot_dispatch():
    assert reads_lengths("least-loaded", "fcfs") and reads_lengths("random", "lpt")
    assert not reads_lengths("round-robin", "fcfs")
    assert not reads_lengths(None, "fcfs")  # one instance: dispatch is moot


def test_an_unread_length_predictor_is_an_inert_key():
    spec = RunSpec().model_copy(deep=True)
    spec.policies.dispatch, spec.policies.scheduling = "random", "fcfs"
    spec.policies.length_predictor = "noisy-oracle"
    assert any(
        line.startswith("policies.length_predictor=noisy-oracle") for line in inert_keys(spec)
    )
