"""The cost-model estimates the search starts from: the drain of one instance exactly, and
the modes in the order their overlap implies."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from experiments.advise_estimate import Estimator, drain_s
from experiments.advise_plan import SpaceOptions, plan_space
from policies.protocols import Device
from tests.test_advise_space import small_spec


class UnitSteps:
    """Every decode step takes 1 s, whatever the batch and context."""

    def decode_step_s(self, device: Device, batch_size: int, context_tokens: int) -> float:
        return 1.0


def test_drain_with_room_for_all_is_the_longest_sequence():
    lengths = np.array([9, 5, 3, 1])
    assert drain_s(UnitSteps(), Device("H800", 1), lengths, slots=4, prompt_tokens=10) == 9.0


def test_drain_one_at_a_time_is_the_sum_and_refills_as_sequences_finish():
    lengths = np.array([9, 5, 3, 1])
    assert drain_s(UnitSteps(), Device("H800", 1), lengths, slots=1, prompt_tokens=10) == 18.0
    # two slots: 9 | 5 then 3 (ends at 8) then 1 (ends at 9): the longest sets the end
    assert drain_s(UnitSteps(), Device("H800", 1), lengths, slots=2, prompt_tokens=10) == 9.0


def test_modes_are_ordered_by_how_much_they_overlap():
    base = small_spec()
    estimator = Estimator.of(base)
    space = plan_space(base, SpaceOptions(max_staleness=2))
    s = next(c.structure for c in space.candidates if c.structure.mode == "stream-async")
    value = {
        f"{m}:{lag}": estimator.throughput(replace(s, mode=m, lag=lag))
        for m, lag in [
            ("disagg-sync", None),
            ("stream-sync", None),
            ("one-step-async", None),
            ("stream-async", None),
            ("pipeline", 1),
            ("pipeline", 2),
        ]  # fmt: skip
    }
    assert value["disagg-sync:None"] < value["stream-sync:None"] <= value["stream-async:None"]
    assert value["one-step-async:None"] <= value["stream-async:None"]
    assert value["pipeline:1"] <= value["pipeline:2"]


def test_more_generation_gpus_never_lengthen_generation():
    base = small_spec()
    estimator = Estimator.of(base)
    s = plan_space(base, SpaceOptions()).input.structure
    times = [estimator.generation_s(replace(s, generation_gpus=(n,))) for n in (2, 4, 8, 12)]
    assert times == sorted(times, reverse=True)
