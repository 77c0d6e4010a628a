"""Pipeline-mode controllers driven by scripted events; the exact commands they answer with.

The scripted controller is ``controller_script.Script``; elastic generation is in
``test_elastic_controllers``.
"""

from __future__ import annotations

import pytest
from controller_script import BARRIER, Script
from helpers import make_spec

from policies.build import controller_config
from policies.modes import MODES
from policies.modes.events import (
    Dispatch,
    Finish,
    OptimizerStep,
    Phase,
    PushWeights,
    RequestsAborted,
    SwitchContext,
    TrainSamples,
)
from policies.modes.pipeline import PipelineController
from policies.modes.wave import WaveController
from policies.records import InflightHandling

# -- construction -------------------------------------------------------------------------


def test_mode_registry_and_controller_classes():
    required = {
        "colocated-sync",
        "disagg-sync",
        "stream-sync",
        "one-step-async",
        "stream-async",
        "pipeline",
    }
    assert required <= set(MODES.names())
    with pytest.raises(ValueError, match="already registered"):
        MODES.register("pipeline")(lambda **_: None)
    assert isinstance(Script("disagg-sync").ctl, WaveController)
    assert isinstance(Script("pipeline").ctl, PipelineController)


@pytest.mark.parametrize(
    ("mode", "colocated", "streaming", "max_lag", "inflight"),
    [
        ("colocated-sync", True, False, 0, BARRIER),
        ("disagg-sync", False, False, 0, BARRIER),
        ("stream-sync", False, True, 0, BARRIER),
        ("one-step-async", False, False, 1, BARRIER),
        ("stream-async", False, True, 1, BARRIER),
        ("pipeline", False, True, 3, InflightHandling.DRAIN),
    ],
)
def test_controller_config_of_each_mode(mode, colocated, streaming, max_lag, inflight):
    # the others fix their own lag, and update between batches (no inflight to set)
    more = {"pipeline.max_lag": 3, "pipeline.inflight": "drain"} if mode == "pipeline" else {}
    spec = make_spec({"pipeline.mode": mode, **more})
    config = controller_config(spec, micro_batch_samples=5)
    assert (config.colocated, config.streaming, config.max_lag, config.inflight) == (
        colocated,
        streaming,
        max_lag,
        inflight,
    )
    assert (config.num_steps, config.batch_size, config.group_size) == (10, 1024, 8)
    assert config.micro_batch_samples == 5


# -- wave modes ---------------------------------------------------------------------------


def test_disagg_sync_trains_after_the_batch_and_waits_for_weights():
    s = Script("disagg-sync")
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    assert s.finish(1, 1, 1.0) == []
    assert s.finish(0, 0, 2.0) == []
    assert s.finish(3, 1, 3.0) == []
    assert s.finish(2, 0, 4.0) == [TrainSamples(0, s.cs(1, 0, 3, 2)), OptimizerStep(0)]
    assert s.ctl.wave_gen_time_s == {0: 4.0}
    assert s.step_done(0, 6.0) == [PushWeights(1, BARRIER)]
    assert s.loaded(0, 1, 7.0) == []  # instance 1 still holds version 0
    assert s.loaded(1, 1, 7.5) == [Dispatch(0, s.rs(4, 6)), Dispatch(1, s.rs(5, 7))]
    assert s.prompts.calls == [0, 1]
    for sid, t in [(4, 8.0), (5, 8.5), (6, 9.0)]:
        assert s.finish(sid, sid % 2, t, v_start=1) == []
    assert s.finish(7, 1, 9.5, v_start=1) == [TrainSamples(1, s.cs(4, 5, 6, 7)), OptimizerStep(1)]
    assert s.step_done(1, 11.0) == [Finish()]
    assert s.ctl.finished
    assert s.ctl.train_step_of == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_stream_sync_streams_micro_batches_while_generating():
    s = Script("stream-sync", micro_batch=2)
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    assert s.finish(0, 0, 1.0) == []
    assert s.finish(3, 1, 2.0) == [TrainSamples(0, s.cs(0, 3))]
    assert s.finish(1, 1, 3.0) == []
    assert s.finish(2, 0, 4.0) == [TrainSamples(0, s.cs(1, 2)), OptimizerStep(0)]
    assert s.step_done(0, 5.0) == [PushWeights(1, BARRIER)]
    assert s.loaded(1, 1, 5.5) == []
    assert s.loaded(0, 1, 6.0) == [Dispatch(0, s.rs(4, 6)), Dispatch(1, s.rs(5, 7))]


def test_stream_sync_flushes_a_partial_micro_batch_at_the_end_of_the_wave():
    s = Script("stream-sync", micro_batch=3)
    s.start()
    assert s.finish(0, 0, 1.0) == []
    assert s.finish(1, 1, 2.0) == []
    assert s.finish(2, 0, 3.0) == [TrainSamples(0, s.cs(0, 1, 2))]
    assert s.finish(3, 1, 4.0) == [TrainSamples(0, s.cs(3)), OptimizerStep(0)]


def test_one_step_async_dispatches_the_next_wave_before_the_step_finishes():
    s = Script("one-step-async", iterations=3)
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    for sid in (0, 1, 2):
        assert s.finish(sid, sid % 2, 1.0 + sid) == []
    # wave 0 generated: train it, and start wave 1 at once with weights 0 (lag 1)
    assert s.finish(3, 1, 4.0) == [
        TrainSamples(0, s.cs(0, 1, 2, 3)),
        OptimizerStep(0),
        Dispatch(0, s.rs(4, 6)),
        Dispatch(1, s.rs(5, 7)),
    ]
    for sid in (4, 5, 6):
        assert s.finish(sid, sid % 2, 5.0 + sid) == []
    # wave 1 generated before step 0 is done: wave 2 needs weights ≥ 1 everywhere
    assert s.finish(7, 1, 13.0) == [TrainSamples(1, s.cs(4, 5, 6, 7)), OptimizerStep(1)]
    assert s.step_done(0, 14.0) == [PushWeights(1, BARRIER)]
    assert s.loaded(0, 1, 15.0) == []
    assert s.loaded(1, 1, 15.0) == [Dispatch(0, s.rs(8, 10)), Dispatch(1, s.rs(9, 11))]
    assert s.step_done(1, 16.0) == [PushWeights(2, BARRIER)]
    for sid in (8, 9, 10):
        assert s.finish(sid, sid % 2, 17.0 + sid, v_start=1) == []
    assert s.finish(11, 1, 30.0, v_start=1) == [
        TrainSamples(2, s.cs(8, 9, 10, 11)),
        OptimizerStep(2),
    ]
    assert s.loaded(0, 2, 31.0) == []
    assert s.loaded(1, 2, 31.0) == []  # no wave 3 in a three-step run
    assert s.step_done(2, 32.0) == [Finish()]


def test_one_step_async_next_wave_waits_for_the_step_before_last():
    s = Script("one-step-async", iterations=3)
    s.start()
    for sid in range(3):
        s.finish(sid, sid % 2, 1.0)
    s.finish(3, 1, 2.0)
    # step 0 finishes and weights 1 land while wave 1 is still generating
    assert s.step_done(0, 3.0) == [PushWeights(1, BARRIER)]
    assert s.loaded(0, 1, 3.5) == []
    assert s.loaded(1, 1, 3.5) == []  # wave 1 is still running
    for sid in (4, 5, 6):
        assert s.finish(sid, sid % 2, 4.0) == []
    assert s.finish(7, 1, 5.0) == [
        TrainSamples(1, s.cs(4, 5, 6, 7)),
        OptimizerStep(1),
        Dispatch(0, s.rs(8, 10)),
        Dispatch(1, s.rs(9, 11)),
    ]


def test_stream_async_streams_and_runs_one_step_ahead():
    s = Script("stream-async", micro_batch=2)
    s.start()
    assert s.finish(2, 0, 1.0) == []
    assert s.finish(0, 0, 2.0) == [TrainSamples(0, s.cs(2, 0))]
    assert s.finish(1, 1, 3.0) == []
    assert s.finish(3, 1, 4.0) == [
        TrainSamples(0, s.cs(1, 3)),
        OptimizerStep(0),
        Dispatch(0, s.rs(4, 6)),
        Dispatch(1, s.rs(5, 7)),
    ]


def test_colocated_sync_switches_context_around_each_step():
    s = Script("colocated-sync")
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    for sid in (0, 1, 2):
        assert s.finish(sid, sid % 2, 1.0 + sid) == []
    assert s.finish(3, 1, 4.0) == [SwitchContext(Phase.TRAIN)]
    assert s.switched(Phase.TRAIN, 5.0) == [TrainSamples(0, s.cs(0, 1, 2, 3)), OptimizerStep(0)]
    assert s.step_done(0, 6.0) == [SwitchContext(Phase.GENERATE)]
    assert s.switched(Phase.GENERATE, 7.0) == [Dispatch(0, s.rs(4, 6)), Dispatch(1, s.rs(5, 7))]
    assert [v.version for v in s.ctl.views.values()] == [1, 1]  # weights are local
    for sid in (4, 5, 6):
        assert s.finish(sid, sid % 2, 8.0, v_start=1) == []
    assert s.finish(7, 1, 9.0, v_start=1) == [SwitchContext(Phase.TRAIN)]
    assert s.switched(Phase.TRAIN, 10.0) == [TrainSamples(1, s.cs(4, 5, 6, 7)), OptimizerStep(1)]
    assert s.step_done(1, 11.0) == [Finish()]


# -- pipeline mode --------------------------------------------------------------------------


def test_pipeline_throttles_by_lag_budget_and_pushes_weights_in_flight():
    s = Script("pipeline", iterations=3, max_num_seqs=2, **{"pipeline.max_lag": 1})
    # four free slots: two groups start with weights 0
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    assert s.finish(0, 0, 1.0) == []  # one slot free, a group needs two
    # micro-batch of two; two free slots → the next group starts
    assert s.finish(1, 1, 2.0) == [
        TrainSamples(0, s.cs(0, 1)),
        Dispatch(0, s.rs(4)),
        Dispatch(1, s.rs(5)),
    ]
    assert s.finish(2, 0, 3.0) == []
    assert s.finish(3, 1, 4.0) == [
        TrainSamples(0, s.cs(2, 3)),
        OptimizerStep(0),
        Dispatch(0, s.rs(6)),
        Dispatch(1, s.rs(7)),
    ]
    # step 0 done: weights 1 go out at once, loaded in flight (no barrier)
    assert s.step_done(0, 5.0) == [PushWeights(1, InflightHandling.KEEP)]
    assert s.finish(4, 0, 6.0) == []
    # step 1 holds 4, 5 and must keep two slots for 6, 7 (due by step 1 too): samples
    # with weights 0 would be due at step 1 as well, so nothing more may start
    assert s.finish(5, 1, 7.0) == [TrainSamples(1, s.cs(4, 5))]
    assert s.loaded(0, 1, 8.0) == []  # instance 1 still holds weights 0
    # with weights 1 everywhere a group is due at step 2: it may start
    assert s.loaded(1, 1, 9.0) == [Dispatch(0, s.rs(8)), Dispatch(1, s.rs(9))]
    assert s.finish(6, 0, 10.0) == []
    assert s.finish(7, 1, 11.0) == [
        TrainSamples(1, s.cs(6, 7)),
        OptimizerStep(1),
        Dispatch(0, s.rs(10)),
        Dispatch(1, s.rs(11)),
    ]
    assert s.step_done(1, 12.0) == [PushWeights(2, InflightHandling.KEEP)]
    assert s.finish(8, 0, 13.0, v_start=1) == []
    assert s.finish(9, 1, 14.0, v_start=1) == [TrainSamples(2, s.cs(8, 9))]
    assert s.finish(10, 0, 15.0, v_start=1, v_end=2) == []
    assert s.finish(11, 1, 16.0, v_start=1, v_end=2) == [
        TrainSamples(2, s.cs(10, 11)),
        OptimizerStep(2),
    ]
    assert s.prompts.calls == [0, 1, 2]
    assert s.step_done(2, 17.0) == [Finish()]
    assert s.ctl.train_step_of == {i: i // 4 for i in range(12)}


@pytest.mark.parametrize("inflight", ["keep", "abort-resubmit", "drain"])
def test_pipeline_pushes_with_the_configured_inflight_handling(inflight):
    s = Script("pipeline", iterations=2, **{"pipeline.inflight": inflight})
    s.start()
    for sid in range(4):
        s.finish(sid, sid % 2, 1.0 + sid)
    assert s.step_done(0, 5.0) == [PushWeights(1, InflightHandling(inflight))]


def test_pipeline_fills_every_free_slot_within_the_budget():
    # lag 1, batches of 4: weights 0 may serve steps 0 and 1, i.e. 8 samples
    s = Script("pipeline", iterations=3, **{"pipeline.max_lag": 1})
    assert s.start() == [Dispatch(0, s.rs(0, 2, 4, 6)), Dispatch(1, s.rs(1, 3, 5, 7))]
    assert s.prompts.calls == [0, 1]


def test_pipeline_sync_lag_zero_starts_one_batch_at_a_time():
    s = Script("pipeline", iterations=2, **{"pipeline.max_lag": 0})
    assert s.start() == [Dispatch(0, s.rs(0, 2)), Dispatch(1, s.rs(1, 3))]
    for sid in (0, 1, 2):
        s.finish(sid, sid % 2, 1.0)
    assert s.finish(3, 1, 2.0) == [TrainSamples(0, s.cs(2, 3)), OptimizerStep(0)]
    assert s.step_done(0, 3.0) == [PushWeights(1, InflightHandling.KEEP)]
    assert s.loaded(0, 1, 4.0) == []
    assert s.loaded(1, 1, 4.0) == [Dispatch(0, s.rs(4, 6)), Dispatch(1, s.rs(5, 7))]


def test_pipeline_redispatches_aborted_requests():
    s = Script(
        "pipeline", iterations=2, **{"pipeline.max_lag": 1, "pipeline.inflight": "abort-resubmit"}
    )
    s.start()  # 8 samples: 0, 2, 4, 6 on instance 0 and 1, 3, 5, 7 on instance 1
    for sid in (0, 1, 2):
        s.finish(sid, sid % 2, 1.0)
    assert s.finish(3, 1, 2.0) == [TrainSamples(0, s.cs(2, 3)), OptimizerStep(0)]
    assert s.step_done(0, 3.0) == [PushWeights(1, InflightHandling.ABORT_RESUBMIT)]
    s.loaded(0, 1, 4.0)
    # instance 0 dropped its running requests 4 and 6 when loading: dispatched again;
    # round-robin's cursor is at 8 → 4 to instance 0, 6 to instance 1
    aborted = RequestsAborted(4.0, 0, s.rs(4, 6))
    assert s.ctl.handle(aborted) == [Dispatch(0, s.rs(4)), Dispatch(1, s.rs(6))]
    assert s.ctl.views[0].num_assigned == 1
    assert s.ctl.views[1].num_assigned == 3


# -- conventional ------------------------------------------------------------------------


def test_conventional_generates_two_batches_then_takes_two_steps_and_pushes_once():
    s = Script("conventional", iterations=2, **{"pipeline.steps_per_generation": 2})
    # both batches (samples 0-7) go out at once with version-0 weights
    assert s.start() == [Dispatch(0, s.rs(0, 2, 4, 6)), Dispatch(1, s.rs(1, 3, 5, 7))]
    for i in range(7):
        assert s.finish(i, i % 2, 1.0 + i) == []
    out = s.finish(7, 1, 9.0)
    assert out == [
        TrainSamples(0, s.cs(0, 1, 2, 3)),
        OptimizerStep(0),
        TrainSamples(1, s.cs(4, 5, 6, 7)),
        OptimizerStep(1),
    ]
    assert s.step_done(0, 10.0) == []  # no push between the two steps
    assert s.step_done(1, 11.0) == [Finish()]
    assert [s.ctl.train_step_of[i] for i in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_conventional_pushes_after_each_round_and_waits_for_the_weights():
    s = Script("conventional", iterations=4, **{"pipeline.steps_per_generation": 2})
    s.start()
    for i in range(8):
        out = s.finish(i, i % 2, 1.0 + i)
    assert s.step_done(0, 10.0) == []
    assert s.step_done(1, 11.0) == [PushWeights(2, BARRIER)]
    assert s.loaded(0, 2, 12.0) == []
    second = s.loaded(1, 2, 12.5)
    assert second == [Dispatch(0, s.rs(8, 10, 12, 14)), Dispatch(1, s.rs(9, 11, 13, 15))]
    assert out[-1] == OptimizerStep(1)


def test_conventional_needs_whole_rounds():
    with pytest.raises(ValueError, match="steps_per_generation"):
        Script("conventional", iterations=3, **{"pipeline.steps_per_generation": 2})
