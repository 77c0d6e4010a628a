"""``pipeline.overlap_waves``: a one-step async mode starts batch w before batch w−1's last
answer, with weights loaded in flight, steps still in order and staleness within 1."""

from __future__ import annotations

import pytest
from controller_script import Script
from helpers import make_spec, small_spec

from policies.build import controller_config
from policies.modes.events import (
    Dispatch,
    Finish,
    OptimizerStep,
    PushWeights,
    TrainSamples,
)
from policies.records import InflightHandling
from policies.spec import SpecError, override_spec
from sim.simulator import Simulation

KEEP = InflightHandling.KEEP


def test_batches_overlap_and_steps_stay_in_order():
    s = Script("stream-async", iterations=3, micro_batch=2, **{"pipeline.overlap_waves": True})
    # batches 0 and 1 both start on weights 0 (lag 1 for batch 1); batch 2 needs weights 1
    assert s.start() == [
        Dispatch(0, s.rs(0, 2)),
        Dispatch(1, s.rs(1, 3)),
        Dispatch(0, s.rs(4, 6)),
        Dispatch(1, s.rs(5, 7)),
    ]
    assert s.finish(4, 0, 1.0) == []  # batch 1's sample waits for step 1 to open
    assert s.finish(0, 0, 1.5) == []
    assert s.finish(2, 0, 2.0) == [TrainSamples(0, s.cs(0, 2))]
    for sid, t in ((5, 2.5), (6, 3.0), (7, 3.5), (1, 4.0)):
        assert s.finish(sid, sid % 2, t) == []  # batch 1 generated first: held
    # batch 0's last answer closes step 0, then batch 1's held samples make step 1
    assert s.finish(3, 1, 5.0) == [
        TrainSamples(0, s.cs(1, 3)),
        OptimizerStep(0),
        TrainSamples(1, s.cs(4, 5)),
        TrainSamples(1, s.cs(6, 7)),
        OptimizerStep(1),
    ]
    assert s.step_done(0, 6.0) == [PushWeights(1, KEEP)]  # loaded in flight
    assert s.loaded(0, 1, 6.5) == []
    assert s.loaded(1, 1, 6.5) == [Dispatch(0, s.rs(8, 10)), Dispatch(1, s.rs(9, 11))]
    assert s.step_done(1, 7.0) == [PushWeights(2, KEEP)]  # no batch 3 in a 3-step run
    for sid in (8, 9, 10):
        s.finish(sid, sid % 2, 8.0 + sid, v_start=1)
    assert s.finish(11, 1, 20.0, v_start=1) == [
        TrainSamples(2, s.cs(10, 11)),
        OptimizerStep(2),
    ]
    assert s.step_done(2, 21.0) == [Finish()]


def test_without_overlap_a_batch_waits_for_the_last_answer_of_the_one_before():
    s = Script("stream-async", iterations=3, micro_batch=2)
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    early = [c for sid in (0, 1, 2) for c in s.finish(sid, sid % 2, 1.0 + sid)]
    assert not [c for c in early if isinstance(c, Dispatch)]
    assert s.finish(3, 1, 4.0)[-2:] == [Dispatch(0, s.rs(4, 6)), Dispatch(1, s.rs(5, 7))]
    assert controller_config(s.spec, 2).inflight == InflightHandling.BARRIER


def test_the_key_names_the_modes_it_applies_to_and_is_dropped_when_switching_away():
    spec = make_spec({"pipeline.mode": "stream-async", "pipeline.overlap_waves": True})
    config = controller_config(spec, 1)
    assert config.overlap_waves and config.inflight == KEEP
    with pytest.raises(SpecError, match=r"pipeline\.overlap_waves: applies to .*stream-async"):
        make_spec({"pipeline.mode": "disagg-sync", "pipeline.overlap_waves": True})
    with pytest.raises(SpecError, match=r"pipeline\.overlap_waves: mode 'pipeline' always"):
        make_spec({"pipeline.mode": "pipeline", "pipeline.overlap_waves": False})
    with pytest.raises(SpecError, match=r"pipeline\.overlap_waves: needs pipeline\.inflight"):
        make_spec(
            {
                "pipeline.mode": "stream-async",
                "pipeline.inflight": "abort-resubmit",
                "pipeline.overlap_waves": True,
            }
        )
    # a pipeline spec may carry it (bench peers' base) ...
    base = make_spec({"pipeline.mode": "pipeline", "pipeline.overlap_waves": True})
    assert not controller_config(base, 1).overlap_waves  # pipeline overlaps by design
    # ... and switching modes keeps it where it applies, drops it where it does not
    assert override_spec(base, ["pipeline.mode=one-step-async"]).pipeline.overlap_waves
    assert override_spec(base, ["pipeline.mode=disagg-sync"]).pipeline.overlap_waves is None


def test_simulated_overlap_keeps_staleness_within_one_and_is_not_slower():
    runs = {
        overlap: Simulation(
            small_spec(pipeline__mode="stream-async", pipeline__overlap_waves=overlap)
        ).run()
        for overlap in (False, True)
    }
    for result in runs.values():
        assert result.metrics["max_staleness"] <= 1
        assert result.metrics["num_samples_trained"] == runs[False].metrics["num_samples_trained"]
    sps = {k: r.metrics["throughput_samples_per_s"] for k, r in runs.items()}
    assert sps[True] >= sps[False]
