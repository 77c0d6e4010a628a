"""``InstanceLost``: a dead instance's requests go to the others through the controller's
own dispatch (exact command lists, as tests/test_controllers.py), the next wave no longer
waits for it, and ``InstanceAdded`` brings it back. Two instances, round-robin."""

from __future__ import annotations

from controller_script import Script
from helpers import view

from policies.modes.events import (
    Dispatch,
    InstanceAdded,
    InstanceLost,
    OptimizerStep,
    PushWeights,
    TrainSamples,
    WeightsLoaded,
)
from policies.records import InflightHandling


def test_a_wave_mode_sends_a_lost_instances_requests_to_the_other_and_goes_on_without_it():
    s = Script("stream-sync", iterations=3)
    s.start()  # 0, 2 on instance 0; 1, 3 on instance 1
    assert s.finish(0, 0, 1.0) == []
    assert s.ctl.handle(InstanceLost(1.5, 1, s.rs(1, 3))) == [Dispatch(0, s.rs(1, 3))]
    assert set(s.ctl.views) == {0} and s.ctl.views[0].num_assigned == 3
    assert s.finish(1, 0, 2.0) == [TrainSamples(0, s.cs(0, 1))]  # same ids, same wave
    assert s.finish(2, 0, 2.5) == []
    assert s.finish(3, 0, 3.0) == [TrainSamples(0, s.cs(2, 3)), OptimizerStep(0)]
    assert s.step_done(0, 4.0) == [PushWeights(1, InflightHandling.BARRIER)]
    assert s.ctl.handle(WeightsLoaded(4.2, 1, 1)) == []  # a late load of the lost one: ignored
    assert s.loaded(0, 1, 4.5) == [Dispatch(0, s.rs(4, 5, 6, 7))]  # waits for nobody else
    for sid in (4, 5, 6, 7):
        s.finish(sid, 0, 5.0)
    assert s.step_done(1, 6.0) == [PushWeights(2, InflightHandling.BARRIER)]
    back = InstanceAdded(6.5, view(1, version=2), from_scale_out=False)  # a restart
    assert s.ctl.handle(back) == []  # back at version 2
    assert s.loaded(0, 2, 7.0) == [Dispatch(0, s.rs(8, 10)), Dispatch(1, s.rs(9, 11))]


def test_the_pipeline_mode_sends_a_lost_instances_requests_to_the_others():
    s = Script("pipeline", iterations=2, **{"pipeline.max_lag": 1})
    s.start()  # 0, 2, 4, 6 on instance 0; 1, 3, 5, 7 on instance 1
    for sid in (0, 1, 2):
        s.finish(sid, sid % 2, 1.0)
    lost = InstanceLost(1.5, 1, s.rs(3, 5, 7))
    assert s.ctl.handle(lost) == [Dispatch(0, s.rs(3, 5, 7))]
    assert set(s.ctl.views) == {0} and s.ctl.views[0].num_assigned == 5
    assert s.finish(3, 0, 2.0) == [TrainSamples(0, s.cs(2, 3)), OptimizerStep(0)]
