"""Where each step's time went: interval sets, the per-step partition, steps.json."""

from __future__ import annotations

import json

import pytest
from helpers import small_spec
from hypothesis import given
from hypothesis import strategies as st

from policies.breakdown import step_breakdowns
from policies.intervals import Measure, merged, minus
from policies.records import Span, SpanKind
from policies.resources import TRAINER
from sim.simulator import Simulation

PARTITION = ("train_s", "optimizer_s", "grad_sync_s", "checkpoint_s", "bookkeeping_s", "push_s", "switch_s", "wait_s")  # fmt: skip

intervals = st.lists(
    st.tuples(st.integers(0, 40), st.integers(0, 40)).map(lambda t: (float(min(t)), float(max(t)))),
    max_size=8,
)


def _points(ivs: list[tuple[float, float]]) -> set[float]:
    """The half-integer points an integer-bounded interval set covers."""
    return {x + 0.5 for lo, hi in ivs for x in range(int(lo), int(hi))}


@given(intervals, intervals, st.integers(0, 40), st.integers(0, 40))
def test_interval_sets_agree_with_counting_points(a, b, lo, hi):
    lo, hi = min(lo, hi), max(lo, hi)
    ma, mb = merged(a), merged(b)
    assert _points(ma) == _points(a)
    assert all(x[1] < y[0] for x, y in zip(ma, ma[1:]))  # disjoint, sorted
    assert _points(minus(ma, mb)) == _points(a) - _points(b)
    inside = {p for p in _points(a) if lo < p < hi}
    assert Measure(ma).within(lo, hi) == pytest.approx(len(inside))


def _span(resource: str, kind: SpanKind, start: float, end: float) -> Span:
    return Span(resource, kind, start, end)


def test_a_live_step_is_split_without_overlap():
    spans = [
        _span("gen-0", SpanKind.DECODE, 0.0, 2.5),
        _span("gen-1", SpanKind.DECODE, 0.5, 2.0),
        _span(TRAINER, SpanKind.TRAIN, 1.0, 2.0),  # a micro-batch
        _span(TRAINER, SpanKind.TRAIN, 2.5, 3.5),  # the optimizer step, checkpoint, hooks
        _span(TRAINER, SpanKind.WEIGHT_SYNC, 3.6, 4.0),
        _span("gen-0", SpanKind.WEIGHT_SYNC, 3.8, 4.0),
    ]
    steps = [
        {"step": 0, "end_s": 2.9, "done_s": 3.55, "optimizer_s": 0.4, "checkpoint_s": 0.5,
         "hooks_s": 0.1, "report_s": 0.05},
        {"step": 1, "end_s": 4.2},
    ]  # fmt: skip
    first, second = step_breakdowns(spans, steps)
    assert first.window_s == pytest.approx(3.55)
    assert first.train_s == pytest.approx(2.0 - 1.0)  # the spans less what the step measured
    assert (first.optimizer_s, first.checkpoint_s) == pytest.approx((0.4, 0.5))
    assert first.bookkeeping_s == pytest.approx(0.1 + 0.05)
    assert first.wait_s == pytest.approx(3.55 - 2.0 - 0.05)
    assert first.generate_s == pytest.approx(2.5)
    assert sum(getattr(first, k) for k in PARTITION) == pytest.approx(first.window_s)
    assert second.window_s == pytest.approx(4.2 - 3.55)
    assert second.push_s == pytest.approx(0.4) and second.pause_s == pytest.approx(0.2 / 2)
    assert sum(getattr(second, k) for k in PARTITION) == pytest.approx(second.window_s)


def test_every_simulated_step_in_steps_json_has_its_breakdown(tmp_path):
    spec = small_spec(run__iterations=4)
    result = Simulation(spec).run()
    result.save(tmp_path)
    steps = json.loads((tmp_path / "steps.json").read_text())
    assert [s["step"] for s in steps] == [s["step"] for s in result.steps]
    for step in steps:
        parts = step["breakdown"]
        assert sum(parts[k] for k in PARTITION) == pytest.approx(parts["window_s"])
        assert parts["train_s"] > 0 and parts["generate_s"] > 0
        assert step["optimizer_s"] > 0  # the simulated optimizer step, on its own
        assert parts["optimizer_s"] == pytest.approx(step["optimizer_s"])
    assert "breakdown" not in result.steps[0]  # the run's own records stay as they were


def test_a_simulated_steps_gradient_all_reduce_is_its_own_part_not_training():
    """The exposed all-reduce opens the simulated optimizer job (sim.trainer): the
    breakdown reports it as ``grad_sync_s``, and ``train_s`` is the forward and backward
    alone (before, it held the all-reduce)."""
    spec = small_spec(run__iterations=3)  # 2 H800 train: an all-reduce over NVLink
    result = Simulation(spec).run()
    spans = [s for s in result.spans if s.resource == TRAINER and s.kind == SpanKind.TRAIN]
    for step, parts in zip(result.steps, step_breakdowns(result.spans, result.steps)):
        assert step["grad_sync_s"] > 0
        assert parts.grad_sync_s == pytest.approx(step["grad_sync_s"])
        in_window = sum(
            min(s.end_s, step["end_s"]) - max(s.start_s, step["end_s"] - parts.window_s)
            for s in spans
            if s.start_s < step["end_s"] and s.end_s > step["end_s"] - parts.window_s
        )
        trained = parts.train_s + parts.optimizer_s + parts.grad_sync_s
        assert trained == pytest.approx(in_window)
