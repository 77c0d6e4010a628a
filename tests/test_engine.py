"""The decode law's closed form, and the generation engine's admission, preemption, order and
in-flight weight updates, with hand-computed tick-exact traces.

Unless a test says otherwise a decode step costs 10 ticks and prefill is free.
"""

from __future__ import annotations

import pytest
from engine_harness import make_rig
from helpers import request
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.records import FinishReason, InflightHandling, SpanKind
from policies.scheduling import LptScheduling
from sim.ticks import DecodeLaw

KEEP = InflightHandling.KEEP
ABORT = InflightHandling.ABORT_RESUBMIT
DRAIN = InflightHandling.DRAIN
BARRIER = InflightHandling.BARRIER

# -- DecodeLaw ----------------------------------------------------------------------------------

laws = st.builds(
    DecodeLaw,
    n=st.integers(1, 64),
    p0=st.integers(0, 10**6),
    p1=st.integers(0, 10**3),
    q0=st.integers(0, 10**6),
    q1=st.integers(0, 10**3),
)


@settings(max_examples=300)
@given(law=laws, ctx0=st.integers(0, 10**5), num_steps=st.integers(0, 300))
def test_span_equals_the_sum_of_steps(law, ctx0, num_steps):
    expected = sum(law.step(ctx0 + law.n * k) for k in range(num_steps))
    assert law.span(ctx0, num_steps) == expected


@settings(max_examples=300)
@given(law=laws, ctx0=st.integers(0, 10**5), limit=st.integers(0, 200), frac=st.floats(0, 1.2))
def test_steps_within_is_the_largest_fitting_count(law, ctx0, limit, frac):
    ticks = int(frac * law.span(ctx0, limit))
    k = law.steps_within(ctx0, ticks, limit)
    assert 0 <= k <= limit
    assert law.span(ctx0, k) <= ticks
    assert k == limit or law.span(ctx0, k + 1) > ticks


def test_span_crossing_from_one_term_to_the_other():
    # f = 100 + 1·ctx, g = 10 + 3·ctx, n = 1: g overtakes f at ctx = 45
    law = DecodeLaw(n=1, p0=100, p1=1, q0=10, q1=3)
    assert law.step(44) == 144 and law.step(46) == 148
    assert law.span(40, 10) == sum(max(100 + c, 10 + 3 * c) for c in range(40, 50))


# -- admission ----------------------------------------------------------------------------------


def test_max_num_seqs_limits_the_running_batch():
    rig = make_rig({0: 3, 1: 5, 2: 2}, prefill=lambda tokens: 5, max_num_seqs=2)
    rig.submit_at(0, [request(0), request(1), request(2)])
    rig.run()
    # 0–5 prefill {0,1}; 3 steps → 0 ends at 35; prefill {2} 35–40; 2 steps → 1, 2 end at 60
    assert rig.ticks() == {0: (0, 35), 1: (0, 60), 2: (35, 60)}
    assert [c.output_tokens for c in rig.done] == [3, 5, 2]
    assert all(c.finish_reason == FinishReason.STOP for c in rig.done)
    prefills = [(s.start_s, s.end_s, s.batch_size) for s in rig.spans if s.kind == SpanKind.PREFILL]
    assert prefills == [(0.0, 5e-12, 2), (35e-12, 40e-12, 1)]


def test_kv_capacity_limits_admission():
    # prompts of 10 tokens, capacity 24: two fit (20 + 2 running + 1 ≤ 24), a third does not
    rig = make_rig({0: 2, 1: 2, 2: 2}, kv_capacity_tokens=24)
    rig.submit_at(0, [request(0), request(1), request(2)])
    rig.run()
    assert rig.ticks() == {0: (0, 20), 1: (0, 20), 2: (20, 40)}


def test_preemption_by_recompute_when_the_cache_runs_out():
    # capacity 25, prompts 10, targets 4 and 3, prefill = 1 tick per token.
    # 0–20 prefill both (20 tokens); 2 steps to 40 (ctx 24); no room for another step:
    # sample 1 (newest) is preempted with 2 tokens done; sample 0 ends at 60; sample 1
    # re-prefills prompt + 2 tokens (12 ticks) to 72 and ends one step later, at 82.
    rig = make_rig({0: 4, 1: 3}, prefill=lambda tokens: tokens, kv_capacity_tokens=25)
    rig.submit_at(0, [request(0), request(1)])
    rig.run()
    assert rig.ticks() == {0: (0, 60), 1: (0, 82)}
    assert [c.output_tokens for c in rig.done] == [4, 3]
    prefills = [(s.start_s, s.end_s, s.batch_size) for s in rig.spans if s.kind == SpanKind.PREFILL]
    assert prefills == [(0.0, 20e-12, 2), (60e-12, 72e-12, 1)]


def test_a_sequence_that_cannot_fit_alone_is_an_error():
    rig = make_rig({0: 5}, kv_capacity_tokens=12)
    rig.submit_at(0, [request(0)])
    with pytest.raises(ValueError, match="does not fit the KV cache"):
        rig.run()


def test_max_tokens_truncates_with_length_finish_reason():
    rig = make_rig({0: 50, 1: 3})
    rig.submit_at(0, [request(0, max_tokens=4), request(1, max_tokens=4)])
    rig.run()
    assert [(c.output_tokens, c.finish_reason) for c in rig.done] == [
        (3, FinishReason.STOP),
        (4, FinishReason.LENGTH),
    ]


def test_arrivals_during_a_step_join_at_the_next_boundary():
    rig = make_rig({0: 5, 1: 2})
    rig.submit_at(0, [request(0)])
    rig.submit_at(23, [request(1)])  # mid-step: joins at 30, runs steps 4 and 5 with 0
    rig.run()
    assert rig.ticks() == {0: (0, 50), 1: (30, 50)}
    assert rig.done[0].dispatch_s == 0.0 and rig.done[1].dispatch_s == 23e-12


# -- scheduling order -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lpt", "expected"),
    [
        (False, {0: (0, 20), 1: (20, 70), 2: (70, 100)}),
        (True, {1: (0, 50), 2: (50, 80), 0: (80, 100)}),
    ],
)
def test_admission_order_fcfs_and_lpt(lpt, expected):
    truth = {0: 2, 1: 5, 2: 3}
    rig = make_rig(truth, max_num_seqs=1, scheduling=LptScheduling() if lpt else None)
    rig.submit_at(0, [request(i, predicted=float(t)) for i, t in truth.items()])
    rig.run()
    assert rig.ticks() == expected
    assert [c.sample_id for c in rig.done] == list(expected)


def test_preempted_sequences_go_first_even_under_lpt():
    # capacity 25, prompts of 10: 0 and 1 run; at 20 (ctx 24) 1 is preempted with 2 tokens
    # done. 2 (13-token prompt, predicted longest) arrives at 25; 0 ends at 40. Then the
    # preempted 1 (12 tokens of KV) is admitted before 2, which no longer fits beside it.
    truth = {0: 4, 1: 3, 2: 1}
    rig = make_rig(truth, kv_capacity_tokens=25, scheduling=LptScheduling())
    rig.submit_at(0, [request(0, 100.0), request(1, 50.0)])
    rig.submit_at(25, [request(2, 1000.0, prompt_tokens=13)])
    rig.run()
    assert rig.ticks() == {0: (0, 40), 1: (0, 50), 2: (50, 60)}


# -- in-flight weight updates ---------------------------------------------------------------------


def _versions(rig) -> dict[int, tuple[int, int]]:
    return {c.sample_id: (c.version_start, c.version_end) for c in rig.done}


def test_keep_pauses_at_the_step_boundary_and_keeps_the_kv_cache():
    rig = make_rig({0: 10, 1: 6})
    rig.submit_at(0, [request(0), request(1)])
    rig.push_at(35, 1, KEEP, pause_ticks=7)
    rig.run()
    # the step in progress ends at 40; paused to 47; 1 needs 2 more steps, 0 six more
    assert rig.loads == [(47, 0, 1)]
    assert rig.ticks() == {1: (0, 67), 0: (0, 107)}
    assert _versions(rig) == {0: (0, 1), 1: (0, 1)}
    syncs = [(s.start_s, s.end_s) for s in rig.spans if s.kind == SpanKind.WEIGHT_SYNC]
    assert syncs == [(40e-12, 47e-12)]
    assert rig.engine.version == 1


def test_abort_resubmit_restarts_running_requests_with_the_new_weights():
    rig = make_rig({0: 10, 1: 6}, resubmit_aborted=True)
    rig.submit_at(0, [request(0), request(1)])
    rig.push_at(35, 1, ABORT, pause_ticks=7)
    rig.run()
    assert rig.loads == [(47, 0, 1)]
    assert rig.aborts == [(47, (0, 1))]
    # resubmitted at 47 from scratch: 6 steps for 1, 10 for 0
    assert rig.ticks() == {1: (47, 107), 0: (47, 147)}
    assert _versions(rig) == {0: (1, 1), 1: (1, 1)}
    assert [c.output_tokens for c in rig.done] == [6, 10]


def test_drain_stops_admitting_finishes_running_then_loads():
    rig = make_rig({0: 10, 1: 2})
    rig.submit_at(0, [request(0)])
    rig.push_at(35, 1, DRAIN, pause_ticks=7)
    rig.submit_at(36, [request(1)])
    rig.run()
    # 0 runs to 100 with the old weights; load 100–107; 1 is admitted after it
    assert rig.loads == [(107, 0, 1)]
    assert rig.ticks() == {0: (0, 100), 1: (107, 127)}
    assert _versions(rig) == {0: (0, 0), 1: (1, 1)}


def test_barrier_loads_only_when_idle_after_the_background_transfer():
    rig = make_rig({0: 10, 1: 2})
    rig.submit_at(0, [request(0)])
    rig.push_at(35, 1, BARRIER, pause_ticks=7, transfer_ticks=20)
    rig.submit_at(50, [request(1)])  # admission continues while the weights travel
    rig.run()
    assert rig.ticks() == {1: (50, 70), 0: (0, 100)}
    assert rig.loads == [(107, 0, 1)]
    assert _versions(rig) == {0: (0, 0), 1: (0, 0)}


def test_barrier_on_an_idle_engine_waits_for_the_transfer():
    rig = make_rig({0: 3})
    rig.push_at(10, 1, BARRIER, pause_ticks=7, transfer_ticks=20)
    rig.submit_at(31, [request(0)])  # arrives while loading
    rig.run()
    assert rig.loads == [(37, 0, 1)]
    assert rig.ticks() == {0: (37, 67)}
    assert _versions(rig) == {0: (1, 1)}


def test_keep_on_an_idle_engine_loads_at_once():
    rig = make_rig({0: 2})
    rig.push_at(5, 3, KEEP, pause_ticks=4)
    rig.run()
    assert rig.loads == [(9, 0, 3)]
    assert rig.done == []
