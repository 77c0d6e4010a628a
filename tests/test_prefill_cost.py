"""The stage model's prefill (``sim.prefill_cost``) is what the simulated engine pays."""

from __future__ import annotations

import pytest
from engine_harness import make_rig
from helpers import make_spec, request

from policies.protocols import Device
from sim.costs import build_cost_model
from sim.engine import StepCosts
from sim.prefill_cost import ChunkedPrefill
from sim.ticks import to_seconds, to_ticks


def test_prefill_prices_the_engine_steps():
    # 24 prompts of 1024 tokens, one output token each (it comes with the prefill), 8192
    # tokens a step: the engine runs three steps of eight whole prompts, and nothing else
    cost = build_cost_model(make_spec())
    device = Device("H800", 1)
    rig = make_rig(truth=dict.fromkeys(range(24), 1), max_num_batched_tokens=8192)
    rig.engine.costs = StepCosts(
        law=lambda n: cost.decode_law(device, n),
        mixed=lambda work: to_ticks(cost.mixed_step_s(device, work)),
    )
    rig.submit_at(0, [request(i, prompt_tokens=1024, max_tokens=1) for i in range(24)])
    rig.run()
    assert len(rig.done) == 24 and [s.batch_size for s in rig.spans] == [8, 8, 8]
    expected_s = ChunkedPrefill(cost).prefill_s(device, 24, 1024.0, 8192)
    assert to_seconds(rig.env.now) == pytest.approx(expected_s, rel=1e-9)


def test_prefill_takes_a_last_partial_step():
    prefill, device = ChunkedPrefill(build_cost_model(make_spec())), Device("H800", 1)
    # nine prompts of 1024 tokens: a step of eight, then one of the ninth alone
    nine = prefill.prefill_s(device, 9, 1024.0, 8192)
    assert nine == prefill.prefill_s(device, 8, 1024.0, 8192) + prefill.prefill_s(
        device, 1, 1024.0, 8192
    )
    assert prefill.prefill_s(device, 0, 1024.0, 8192) == 0.0
