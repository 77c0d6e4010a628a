"""Elastic generation in the wave-mode controllers: scale-out (the new instance joins the
next wave with the latest weights) and scale-in (the newest instance drains, never the
last one)."""

from __future__ import annotations

from controller_script import BARRIER, Script
from helpers import view

from policies.modes.events import (
    Dispatch,
    InstanceAdded,
    InstanceLost,
    InstanceRetired,
    OptimizerStep,
    PushWeights,
    ScaleIn,
    ScaleOut,
    TrainSamples,
)


class AddOne:
    def __init__(self) -> None:
        self.calls: list[tuple[float, float, int]] = []

    def instances_to_add(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        self.calls.append((gen_time_s, train_time_s, num_instances))
        return 1


def test_elastic_scale_out_and_the_new_instance_gets_work():
    rule = AddOne()
    s = Script("disagg-sync", iterations=3, scaling=rule)
    s.start()
    for sid in range(4):
        s.finish(sid, sid % 2, 1.0 + sid)
    assert s.step_done(0, 6.0) == [ScaleOut(1), PushWeights(1, BARRIER)]
    assert rule.calls == [(4.0, 0.5, 2)]  # wave 0 took 4 s, step 0 was busy 0.5 s
    # the new instance starts with the latest weights; it joins the next wave
    assert s.ctl.handle(InstanceAdded(6.5, view(2, version=1), from_scale_out=True)) == []
    assert s.loaded(0, 1, 7.0) == []
    # round-robin over three instances from cursor 4: 4→1, 5→2, 6→0, 7→1
    assert s.loaded(1, 1, 7.0) == [
        Dispatch(0, s.rs(6)),
        Dispatch(1, s.rs(4, 7)),
        Dispatch(2, s.rs(5)),
    ]
    for sid in range(4, 8):
        s.finish(sid, [1, 2, 0, 1][sid - 4], 8.0, v_start=1)
    # a second scale-out is asked for only once the first has arrived
    assert s.step_done(1, 9.0) == [ScaleOut(1), PushWeights(2, BARRIER)]
    assert rule.calls[-1] == (1.0, 0.5, 3)
    assert s.loaded(0, 2, 9.5) == []
    assert s.loaded(1, 2, 9.5) == []
    # cursor 8: 8→2, 9→0, 10→1, 11→2
    assert s.loaded(2, 2, 9.5) == [
        Dispatch(0, s.rs(9)),
        Dispatch(1, s.rs(10)),
        Dispatch(2, s.rs(8, 11)),
    ]


def test_no_second_scale_out_while_one_is_pending():
    rule = AddOne()
    s = Script("one-step-async", iterations=4, scaling=rule)
    s.start()
    for sid in range(4):
        s.finish(sid, sid % 2, 1.0)
    for sid in range(4, 8):
        s.finish(sid, sid % 2, 2.0)
    assert s.step_done(0, 3.0) == [ScaleOut(1), PushWeights(1, BARRIER)]
    assert s.step_done(1, 4.0) == [PushWeights(2, BARRIER)]  # still waiting for the first
    assert len(rule.calls) == 1


def test_a_restarted_instance_does_not_end_a_pending_scale_out():
    """Before: any ``InstanceAdded`` ended the pending scale-out, so a lost server restarted
    while the scale-out's server was starting let the rule add another (two for one)."""
    rule = AddOne()
    s = Script("disagg-sync", iterations=4, scaling=rule)
    s.start()
    assert s.ctl.handle(InstanceLost(1.5, 1, s.rs(1, 3))) == [Dispatch(0, s.rs(1, 3))]
    for sid in range(4):
        s.finish(sid, 0, 1.0 + sid)
    assert s.step_done(0, 6.0) == [ScaleOut(1), PushWeights(1, BARRIER)]
    # instance 1, restarted, is back at the push's version; the scale-out's is not yet
    assert s.ctl.handle(InstanceAdded(6.2, view(1, version=1), from_scale_out=False)) == []
    assert s.loaded(0, 1, 6.5) == [Dispatch(0, s.rs(4, 6)), Dispatch(1, s.rs(5, 7))]
    for sid in range(4, 8):
        s.finish(sid, sid % 2, 7.0, v_start=1)
    assert s.step_done(1, 8.0) == [PushWeights(2, BARRIER)]  # still waiting for instance 2
    assert len(rule.calls) == 1
    # instance 2 comes: the scale-out is done, and the next step may decide again
    assert s.ctl.handle(InstanceAdded(8.2, view(2, version=2), from_scale_out=True)) == []
    assert s.loaded(0, 2, 8.5) == []
    assert s.loaded(1, 2, 8.5) == [
        Dispatch(0, s.rs(10)),
        Dispatch(1, s.rs(8, 11)),
        Dispatch(2, s.rs(9)),
    ]
    for sid in range(8, 12):
        s.finish(sid, [1, 2, 0, 1][sid - 8], 9.0, v_start=2)
    assert s.step_done(2, 10.0) == [ScaleOut(1), PushWeights(3, BARRIER)]
    assert rule.calls[-1][2] == 3


class RetireOne:
    def __init__(self) -> None:
        self.calls: list[tuple[float, float, int]] = []

    def instances_to_add(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        return 0

    def instances_to_retire(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        self.calls.append((gen_time_s, train_time_s, num_instances))
        return 1


def test_elastic_scale_in_drains_the_newest_instance_and_gives_it_nothing_new():
    rule = RetireOne()
    s = Script("one-step-async", iterations=3, scaling=rule)
    s.start()
    for sid in range(4):
        s.finish(sid, sid % 2, 1.0 + sid)  # wave 1 goes out: 4, 6 to instance 0; 5, 7 to 1
    assert s.step_done(0, 5.0) == [ScaleIn((1,)), PushWeights(1, BARRIER)]
    assert rule.calls == [(4.0, 0.5, 2)]
    # the retiring instance finishes what it runs; its samples count as any other
    assert s.finish(5, 1, 5.5) == [] and s.finish(7, 1, 5.6) == []
    assert s.ctl.handle(InstanceRetired(5.7, 1)) == []
    assert s.finish(4, 0, 6.0) == []
    assert s.finish(6, 0, 6.1) == [TrainSamples(1, s.cs(5, 7, 4, 6)), OptimizerStep(1)]
    # wave 2 waits for instance 0's weights only, and all of it goes there
    assert s.loaded(0, 1, 6.2) == [Dispatch(0, s.rs(8, 9, 10, 11))]
    assert list(s.ctl.views) == [0] and s.ctl.retiring == {}


def test_the_last_instance_is_never_retired():
    rule = RetireOne()
    s = Script("disagg-sync", iterations=2, scaling=rule)
    s.ctl.views.pop(1)
    s.start()
    for sid in range(4):
        s.finish(sid, 0, 1.0 + sid)
    assert s.step_done(0, 6.0) == [PushWeights(1, BARRIER)]


def test_a_retiring_instance_lost_ends_the_scale_in():
    """Before: the scale-in waited for an ``InstanceRetired`` that a lost instance never
    sends, and the rule was not asked again for the rest of the run."""
    rule = RetireOne()
    s = Script("one-step-async", iterations=4, scaling=rule)
    s.start()
    for sid in range(4):
        s.finish(sid, sid % 2, 1.0 + sid)  # wave 1 goes out: 4, 6 to instance 0; 5, 7 to 1
    assert s.step_done(0, 5.0) == [ScaleIn((1,)), PushWeights(1, BARRIER)]
    assert s.ctl.handle(InstanceLost(5.5, 1, s.rs(5, 7))) == [Dispatch(0, s.rs(5, 7))]
    for sid in range(4, 8):
        s.finish(sid, 0, 6.0)
    assert s.step_done(1, 7.0) == [PushWeights(2, BARRIER)]  # the last one is never retired
    assert len(rule.calls) == 2  # asked again


class RetireTwo(RetireOne):
    def instances_to_retire(
        self, gen_time_s: float, train_time_s: float, num_instances: int, *, time_s: float
    ) -> int:
        self.calls.append((gen_time_s, train_time_s, num_instances))
        return 2


def test_a_scale_in_of_two_instances_ends_when_the_last_one_retires():
    """Before: the first ``InstanceRetired`` ended the scale-in, and the rule decided again
    at the next step while the other instance was still draining."""
    rule = RetireTwo()
    s = Script("one-step-async", iterations=4, scaling=rule)
    s.ctl.views[2] = view(2)
    s.start()
    for sid in range(4):
        s.finish(sid, sid % 3, 1.0 + sid)  # wave 1 goes out: 6 to 0, 4 and 7 to 1, 5 to 2
    assert s.step_done(0, 5.0) == [ScaleIn((1, 2)), PushWeights(1, BARRIER)]
    for sid, instance in ((4, 1), (7, 1), (5, 2), (6, 0)):
        s.finish(sid, instance, 6.0)
    assert s.ctl.handle(InstanceRetired(6.5, 1)) == []  # instance 2 still drains
    assert s.step_done(1, 7.0) == [PushWeights(2, BARRIER)]
    assert len(rule.calls) == 1  # not asked again: the scale-in is still pending
    assert s.ctl.handle(InstanceRetired(7.5, 2)) == []
    assert list(s.ctl.views) == [0] and s.ctl.retiring == {}
