"""Elastic generation in the simulator: it retires idle instances and scales out where
more help; an instance that starts while a weight push goes out still holds the newest
weights once ready, so no barrier waits on it forever; and a run that stalls says why
(``sim.run_loop``) instead of SimPy's generic error.

The spec below was drawn by ``test_properties``: one step finishes during the 0.5 s an
added instance takes to start, so its push reached only the old instance; the added ones
came up with the weights of the ``ScaleOut`` and the next sync batch waited for them.
"""

from __future__ import annotations

import pytest
import simpy
from helpers import make_spec, small_spec

from policies.modes.events import InstanceAdded
from policies.spec import RunSpec
from sim import simulator
from sim.run_loop import SimulationStalled, run_until_done
from sim.simulator import Simulation

# the smallest spec found that stalled: elastic, one instance of two slots, three steps
RACE: dict[str, object] = {
    "run.iterations": 3,
    "run.seed": 0,
    "cluster.generation.0.num_gpus": 1,
    "cluster.generation.0.max_num_seqs": 2,
    "cluster.trainer.num_gpus": 2,
    "workload.kind": "pareto",
    "workload.max_output_tokens": 27,
    "workload.lognormal_median_tokens": 10.0,
    "workload.num_prompts": 64,
    "algorithm.batch_size": 2,
    "algorithm.group_size": 1,
    "pipeline.mode": "disagg-sync",
    "policies.dispatch": "least-loaded",
    "policies.length_predictor": "noisy-oracle",
    "policies.allocation": "elastic",
    "sim.instance_start_s": 0.5,
}


def _race(**overrides: object) -> RunSpec:
    return make_spec({**RACE, **{k.replace("__", "."): v for k, v in overrides.items()}})


def _assert_every_sample_trained_once(spec: RunSpec) -> None:
    result = Simulation(spec).run()
    total = spec.run.iterations * spec.algorithm.batch_size
    assert sorted(s.sample_id for s in result.samples) == list(range(total))
    assert result.metrics["num_samples_trained"] == total
    assert [s["step"] for s in result.steps] == list(range(spec.run.iterations))


def test_instances_started_across_a_push_come_up_with_the_pushed_weights():
    """Step 1 ends (and pushes version 2) at 0.78 s, before the instances asked for after
    step 0 are ready at 0.86 s: they serve batch 2 on version 2, not version 1."""
    result = Simulation(_race()).run()
    assert result.metrics["num_samples_trained"] == 6
    last = [s for s in result.samples if s.iteration == 2]
    assert all(s.version_start == 2 for s in last)
    assert any(s.instance_id > 0 for s in last)  # an added instance took part of it


def test_a_scale_out_of_two_instances_ends_once_with_the_last_one_added(monkeypatch):
    """Each ``ScaleOut`` ends exactly once: of the two instances one adds at once, only the
    last one's ``InstanceAdded`` says ``from_scale_out`` (before: both did)."""
    added: list[tuple[int, bool]] = []
    emit = simulator._World.emit

    def emit_recorded(self, event):  # noqa: ANN001, ANN202 - the world's own method
        if isinstance(event, InstanceAdded):
            added.append((event.view.instance_id, event.from_scale_out))
        emit(self, event)

    monkeypatch.setattr(simulator._World, "emit", emit_recorded)
    Simulation(_race(policies__elastic__gpus_per_step=2)).run()
    assert added == [(1, False), (2, True)]


@pytest.mark.parametrize(
    "overrides",
    [
        {},  # stalled before the fix
        {"pipeline__mode": "stream-sync"},  # stalled before the fix
        {"run__seed": 1},  # stalled before the fix
        {"policies__dispatch": "round-robin"},  # stalled before the fix
        {"policies__dispatch": "skewness-aware"},  # stalled before the fix
        {"policies__elastic__retire": True},  # stalled before the fix
        {"pipeline__mode": "one-step-async"},
        {"pipeline__mode": "stream-async"},
        {"pipeline__mode": "colocated-sync"},
        {"pipeline__mode": "pipeline"},  # never scales: elastic starts as fixed
        {"sim__instance_start_s": 0.0},  # ready before the push: no race
        {"sim__instance_start_s": 60.0},  # ready after the run
        {"sim__instance_start_s": 2.0, "run__iterations": 6},  # across several pushes
        {"cluster__generation__0__max_num_seqs": 1},
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "race",
)
def test_elastic_variants_of_the_race_train_every_sample_once(overrides):
    _assert_every_sample_trained_once(_race(**overrides))


def test_a_stalled_run_says_how_far_it_got_and_what_it_waits_for(monkeypatch):
    """Weights that never arrive (pushes dropped here) leave the sync barrier waiting:
    the error names the steps done and the instance behind, not SimPy's generic one."""
    monkeypatch.setattr(simulator._World, "_push_weights", lambda self, command: None)
    spec = _race(policies__allocation="fixed")
    with pytest.raises(SimulationStalled) as err:
        Simulation(spec).run()
    message = str(err.value)
    assert "only 1 of 3 optimizer steps are done (2 of 6 samples generated)" in message
    assert "instance 0 (serving): weights version 0" in message
    assert "behind the controller's version 1" in message


def test_run_until_done_processes_what_env_run_until_does():
    def trace(runner) -> list[tuple[str, int]]:
        env, log = simpy.Environment(), []
        done = env.event()

        def proc(name: str, delay: int):
            yield env.timeout(delay)
            log.append((name, env.now))
            if name == "b":
                done.succeed()

        for name, delay in [("a", 1), ("b", 2), ("c", 2), ("d", 3)]:
            env.process(proc(name, delay))
        runner(env, done)
        return log + [("end", env.now)]

    expected = trace(lambda env, done: env.run(until=done))
    assert expected == [("a", 1), ("b", 2), ("c", 2), ("end", 2)]
    assert trace(lambda env, done: run_until_done(env, done, lambda: "")) == expected


def test_run_until_done_raises_the_report_when_events_run_out():
    env = simpy.Environment()

    def waits_forever():
        yield env.timeout(1)
        yield env.event()  # nothing will trigger it

    env.process(waits_forever())
    with pytest.raises(SimulationStalled, match="waiting for nothing"):
        run_until_done(env, env.event(), lambda: "waiting for nothing")


def test_a_training_bound_simulation_retires_idle_instances_and_keeps_its_throughput():
    shape = dict(
        policies__allocation="elastic", pipeline__mode="one-step-async", run__iterations=8,
        cluster__generation__0__num_gpus=4, cluster__trainer__num_gpus=1,
        workload__lognormal_median_tokens=20.0, workload__max_output_tokens=60,
        algorithm__batch_size=32, algorithm__group_size=4, policies__elastic__gpus_per_step=1,
    )  # fmt: skip
    kept = Simulation(small_spec(**shape)).run()
    retired = Simulation(small_spec(**shape, policies__elastic__retire=True)).run()
    frame = retired.samples_frame()
    assert len(frame) == 8 * 32 and frame["sample_id"].is_unique
    last_dispatch = frame.groupby("instance_id")["dispatch_s"].max()
    # the newest go first, each after its last request; instance 0 is never retired
    assert last_dispatch[3] < last_dispatch[2] < last_dispatch[1] < last_dispatch[0]
    assert kept.samples_frame().groupby("instance_id")["dispatch_s"].max().nunique() == 1
    assert retired.metrics["throughput_samples_per_s"] == pytest.approx(
        kept.metrics["throughput_samples_per_s"], rel=0.01
    )


def test_an_elastic_simulation_scales_out_past_max_num_seqs_at_equal_wave_counts():
    # 2 instances of 16 slots hold 32 requests each, 3 would hold 22: two waves either
    # way, yet a third instance shortens generation, and elastic must see that
    shape = dict(
        pipeline__mode="one-step-async", run__iterations=6,
        cluster__generation__0__num_gpus=2, cluster__generation__0__max_num_seqs=16,
        cluster__trainer__num_gpus=8, algorithm__batch_size=64, algorithm__group_size=4,
        policies__elastic__gpus_per_step=1, policies__elastic__max_extra_instances=1,
        sim__instance_start_s=1.0,
    )  # fmt: skip
    fixed = Simulation(small_spec(**shape)).run()
    elastic = Simulation(small_spec(**shape, policies__allocation="elastic")).run()
    assert elastic.samples_frame()["instance_id"].nunique() == 3
    assert elastic.metrics["throughput_samples_per_s"] > fixed.metrics["throughput_samples_per_s"]
