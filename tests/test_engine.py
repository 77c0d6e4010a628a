"""The decode law's closed form, and the generation engine (vLLM V1's scheduler): admission,
token budget and chunked prefill, block-granular KV, preemption, prefix sharing, order
and in-flight weight updates, with hand-computed tick-exact traces.

Unless a test says otherwise every step costs 10 ticks (a step with both prefill and
decode costs the two: 20), the KV cache has blocks of one token and no budget binds. A
prefill step samples a request's first token, so T output tokens take T steps.
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


def _prefills(rig) -> list[tuple[float, float, int | None]]:
    return [(s.start_s, s.end_s, s.batch_size) for s in rig.spans if s.kind == SpanKind.PREFILL]


def test_max_num_seqs_limits_the_running_batch():
    rig = make_rig({0: 3, 1: 5, 2: 2}, prefill=lambda tokens: 5, max_num_seqs=2)
    rig.submit_at(0, [request(0), request(1), request(2)])
    rig.run()
    # 0–5 prefill {0,1} (first tokens); 2 steps → 0 ends at 25; then 1 decodes while 2
    # prefills (5 + 10 = 15 ticks) to 40; one more step ends both at 50
    assert rig.ticks() == {0: (0, 25), 1: (0, 50), 2: (25, 50)}
    assert [c.output_tokens for c in rig.done] == [3, 5, 2]
    assert all(c.finish_reason == FinishReason.STOP for c in rig.done)
    assert _prefills(rig) == [(0.0, 5e-12, 2), (25e-12, 40e-12, 2)]


def test_the_whole_sequence_must_fit_the_free_blocks_to_be_admitted():
    # prompts of 10 tokens, 24 blocks: two fit (20), a third does not (4 left)
    rig = make_rig({0: 2, 1: 2, 2: 2}, kv_capacity_tokens=24)
    rig.submit_at(0, [request(0), request(1), request(2)])
    rig.run()
    assert rig.ticks() == {0: (0, 20), 1: (0, 20), 2: (20, 40)}


def test_preemption_by_recompute_resumes_from_its_cached_blocks():
    # 25 blocks, prompts of 10, targets 5 and 4, prefill 1 tick per token.
    # 0–20 prefill both (20 blocks); 2 steps to 40 (24 blocks held). At 40 sample 0 takes
    # the last block and sample 1 (the newest) finds none: it preempts itself with 3
    # tokens, its blocks freed but cached. 0 decodes alone to 50 and ends at 60 (taking a
    # block evicts 1's last cached one). Sample 1 resumes from 10 prompt + 1 own cached
    # blocks: 2 tokens to prefill again, 60–62, which sample its 4th token.
    rig = make_rig({0: 5, 1: 4}, prefill=lambda tokens: tokens, kv_capacity_tokens=25)
    rig.submit_at(0, [request(0), request(1)])
    rig.run()
    assert rig.ticks() == {0: (0, 60), 1: (0, 62)}
    assert [c.output_tokens for c in rig.done] == [5, 4]
    assert _prefills(rig) == [(0.0, 20e-12, 2), (60e-12, 62e-12, 1)]
    assert (rig.engine.scheduler.num_preemptions, rig.engine.scheduler.num_recomputed_tokens) == (
        1,
        2,
    )


def test_without_prefix_caching_a_preempted_request_recomputes_everything():
    rig = make_rig(
        {0: 5, 1: 4}, prefill=lambda tokens: tokens, kv_capacity_tokens=25,
        enable_prefix_caching=False,
    )  # fmt: skip
    rig.submit_at(0, [request(0), request(1)])
    rig.run()
    assert rig.ticks() == {0: (0, 60), 1: (0, 73)}  # 13 tokens again, 60–73
    assert rig.engine.scheduler.num_recomputed_tokens == 13


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
    rig.submit_at(23, [request(1)])  # mid-step: joins at 30, prefilled beside 0's decode
    rig.run()
    # 30–50 one step of both (10 + 10); 50–60 the last of each
    assert rig.ticks() == {0: (0, 60), 1: (30, 60)}
    assert rig.done[0].dispatch_s == 0.0 and rig.done[1].dispatch_s == 23e-12


# -- token budget, chunked prefill, blocks ---------------------------------------------------


def test_a_long_prompt_is_prefilled_in_chunks_after_the_decodes_of_the_step():
    # budget 8 tokens a step, prefill 1 tick per token: 0 (prompt 4) prefills 0–4 and
    # decodes; 1 (prompt 12) arrives at 5 and joins at 14: 0's decode takes 1 token of
    # the budget, 1 gets a 7-token chunk (17 ticks, no token yet), then its last 5 (31–36)
    rig = make_rig(
        {0: 3, 1: 2}, prefill=lambda tokens: tokens, max_num_seqs=4, max_num_batched_tokens=8
    )
    rig.submit_at(0, [request(0, prompt_tokens=4)])
    rig.submit_at(5, [request(1, prompt_tokens=12)])
    rig.run()
    assert rig.ticks() == {0: (0, 31), 1: (14, 46)}
    assert _prefills(rig) == [(0.0, 4e-12, 1), (14e-12, 31e-12, 2), (31e-12, 36e-12, 1)]


def test_kv_blocks_are_taken_at_block_boundaries_and_their_lack_preempts():
    # blocks of 4 tokens, 4 blocks; prompts of 3, 10 tokens each. Both need a second block
    # at their 2nd decode step (4 tokens computed) and a third at their 6th: at 60 there
    # is one block only, sample 1 is preempted (2 blocks freed, cached; taking one back
    # for sample 0 evicts one), 0 finishes at 100; 1 resumes from 4 cached tokens of its
    # 9 (5 to prefill again, 100–110) and decodes its last 3 tokens to 140
    rig = make_rig({0: 10, 1: 10}, kv_capacity_tokens=16, block_size=4)
    rig.submit_at(0, [request(0, prompt_tokens=3), request(1, prompt_tokens=3)])
    rig.run()
    assert rig.ticks() == {0: (0, 100), 1: (0, 140)}
    sched = rig.engine.scheduler
    assert (sched.num_preemptions, sched.num_recomputed_tokens) == (1, 5)
    assert sched.kv.num_used == 0


def test_grpo_siblings_share_their_prompt_blocks_within_one_weight_version():
    # blocks of 4, prompts of 10 (2 full blocks), prefill 1 tick per token. Siblings 0 and
    # 1 are admitted in one step: 1 reuses 0's two full blocks, so 10 + 2 tokens are
    # prefilled (0–12), in 4 blocks, not 6. A third sibling arriving at 40 reuses them
    # again from the cache (2 tokens, 40–42) — unless an update came in between.
    def rig_with(update: bool):
        rig = make_rig({0: 2, 1: 2, 2: 2}, prefill=lambda tokens: tokens, block_size=4)
        rig.submit_at(0, [request(i, group_size=3) for i in (0, 1)])
        if update:
            rig.push_at(30, 1, KEEP, pause_ticks=5)
        rig.submit_at(40, [request(2, group_size=3)])
        return rig

    same = rig_with(update=False)
    same.run(until=5)
    assert same.engine.scheduler.kv.num_used == 4
    same.run()
    assert _prefills(same) == [(0.0, 12e-12, 2), (40e-12, 42e-12, 1)]
    updated = rig_with(update=True)
    updated.run()
    assert _prefills(updated) == [(0.0, 12e-12, 2), (40e-12, 50e-12, 1)]  # nothing shared


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


def test_lpt_admits_an_older_batch_before_a_newer_batchs_longer_requests():
    # one slot; 1 is the longest but of the next batch: the older batch goes first, longest
    # first (2 then 0), as the trainer needs it
    truth = {0: 2, 1: 5, 2: 3}
    rig = make_rig(truth, max_num_seqs=1, scheduling=LptScheduling())
    iteration = {0: 0, 1: 1, 2: 0}
    rig.submit_at(0, [request(i, float(t), iteration=iteration[i]) for i, t in truth.items()])
    rig.run()
    assert rig.ticks() == {2: (0, 30), 0: (30, 50), 1: (50, 100)}
    assert [c.sample_id for c in rig.done] == [2, 0, 1]


def _preemption_rig(policy: str, lpt: bool):
    # 25 blocks, prompts of 10, prefill 1 tick per token: 0 and 1 run; 2 (13-token prompt)
    # arrives at 25; at 40 sample 1 preempts itself (3 tokens done); 0 ends at 60
    truth = {0: 5, 1: 4, 2: 1}
    rig = make_rig(
        truth, prefill=lambda tokens: tokens, kv_capacity_tokens=25,
        scheduling=LptScheduling() if lpt else None, scheduling_policy=policy,
    )  # fmt: skip
    rig.submit_at(0, [request(0, 100.0), request(1, 50.0)])
    rig.submit_at(25, [request(2, 1000.0, prompt_tokens=13)])
    rig.run()
    return rig


def test_priority_policy_readmits_a_preempted_request_by_its_priority():
    # vLLM's priority queue: 2 (predicted 1000) goes before the preempted 1 (predicted 50),
    # 60–73. Its 13 blocks evict the least recently freed cached ones first: 1's (freed at
    # 40) before 0's prompt (freed at 60), so 1 keeps 2 cached blocks and prefills 11
    # tokens again, 73–84
    rig = _preemption_rig("priority", lpt=True)
    assert rig.ticks() == {0: (0, 60), 2: (60, 73), 1: (0, 84)}


def test_fcfs_policy_readmits_a_preempted_request_first():
    rig = _preemption_rig("fcfs", lpt=False)
    assert rig.ticks() == {0: (0, 60), 1: (0, 62), 2: (62, 75)}


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
    # 50–70 0 decodes while 1 prefills; 1 ends at 80, 0 at 110; then the load, 110–117
    assert rig.ticks() == {1: (50, 80), 0: (0, 110)}
    assert rig.loads == [(117, 0, 1)]
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
