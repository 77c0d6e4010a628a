"""``pipeline.max_lag`` is the ``pipeline`` mode's; the other modes fix their own bound, so
setting another value for them is an error naming the key, never silently ignored."""

from __future__ import annotations

import pytest
import yaml
from helpers import ALL_MODES, STALENESS_BOUND, make_spec

import experiments.reproduce.pipelinerl as pipelinerl
import experiments.reproduce.streamrl_points as streamrl
from experiments.specs import config_path
from policies.build import controller_config
from policies.modes import DEFAULT_MAX_LAG
from policies.spec import SpecError, load_spec, override_spec, spec_from_dict

SHIPPED = ["live-tiny", "pipelinerl-7b", "streamrl-7b", "streamrl-32b", "streamrl-72b"]


@pytest.mark.parametrize("mode", sorted(STALENESS_BOUND))
def test_a_lag_a_mode_does_not_take_is_an_error_naming_the_key(mode):
    wrong = STALENESS_BOUND[mode] + 2
    with pytest.raises(SpecError, match=r"pipeline\.max_lag: .*fixed at"):
        make_spec({"pipeline.mode": mode, "pipeline.max_lag": wrong})
    with pytest.raises(SpecError, match=r"pipeline\.max_lag"):
        load_spec(None, [f"pipeline.mode={mode}", f"pipeline.max_lag={wrong}"])
    same = make_spec({"pipeline.mode": mode, "pipeline.max_lag": STALENESS_BOUND[mode]})
    assert controller_config(same, 1).max_lag == STALENESS_BOUND[mode]  # its own bound: fine


def test_conventional_takes_only_steps_per_generation_minus_one():
    base = {
        "pipeline.mode": "conventional",
        "pipeline.steps_per_generation": 4,
        "run.iterations": 8,
    }
    assert make_spec({**base, "pipeline.max_lag": 3}).pipeline.max_lag == 3
    assert controller_config(make_spec(base), 1).max_lag == 3
    with pytest.raises(SpecError, match=r"pipeline\.max_lag"):
        make_spec({**base, "pipeline.max_lag": 1})


def test_pipeline_resolves_its_default_and_keeps_a_set_lag():
    assert make_spec({"pipeline.mode": "pipeline"}).pipeline.max_lag == DEFAULT_MAX_LAG == 4
    assert make_spec({"pipeline.mode": "pipeline", "pipeline.max_lag": 0}).pipeline.max_lag == 0


@pytest.mark.parametrize("config", SHIPPED)
@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_shipped_config_runs_every_mode_and_its_resolved_spec_loads_again(
    config, mode, tmp_path
):
    spec = load_spec(config_path(config), [f"pipeline.mode={mode}"])
    (tmp_path / "spec.yaml").write_text(spec.to_yaml())
    again = load_spec(tmp_path / "spec.yaml")  # a saved spec.yaml is the resolved spec
    assert again == spec == spec_from_dict(yaml.safe_load(spec.to_yaml()))
    bound = controller_config(again, 1).max_lag
    assert bound == STALENESS_BOUND.get(mode, spec.pipeline.max_lag)
    switched = override_spec(again, ["pipeline.mode=disagg-sync"])  # from a saved spec too
    assert controller_config(switched, 1).max_lag == 0


def test_switching_mode_drops_a_lag_that_belonged_to_the_old_mode():
    tiny = load_spec(config_path("live-tiny"))  # stream-async, max_lag: 1 for pipeline runs
    assert tiny.pipeline.max_lag == 1
    assert load_spec(config_path("live-tiny"), ["pipeline.mode=pipeline"]).pipeline.max_lag == 1
    assert (
        load_spec(config_path("live-tiny"), ["pipeline.mode=stream-sync"]).pipeline.max_lag is None
    )
    conventional = load_spec(config_path("pipelinerl-7b"), ["pipeline.mode=conventional"])
    assert conventional.pipeline.max_lag is None
    with pytest.raises(SpecError, match=r"pipeline\.max_lag"):
        load_spec(
            config_path("pipelinerl-7b"), ["pipeline.mode=conventional", "pipeline.max_lag=3"]
        )


def test_the_builder_refuses_a_lag_slipped_past_validation():
    spec = make_spec({"pipeline.mode": "pipeline", "pipeline.max_lag": 3})
    copied = spec.model_copy(
        update={"pipeline": spec.pipeline.model_copy(update={"mode": "stream-sync"})}
    )
    with pytest.raises(ValueError, match=r"pipeline\.max_lag: 3 does not apply"):
        controller_config(copied, 1)


@pytest.mark.parametrize("budget", ["QUICK", "FULL"])
def test_the_reproduction_grids_set_max_lag_only_where_it_means_something(budget):
    points = pipelinerl.all_points(getattr(pipelinerl, budget))
    points += streamrl.all_points(getattr(streamrl, budget))
    for point in points:
        spec = point.spec()  # validates
        if any(o.startswith("pipeline.max_lag=") for o in point.overrides):
            assert spec.pipeline.mode == "pipeline", point


def test_push_every_is_the_pipeline_modes_and_dropped_when_switching_away():
    spec = make_spec({"pipeline.mode": "pipeline", "pipeline.push_every": 3})
    assert controller_config(spec, 1).push_every == 3
    with pytest.raises(SpecError, match=r"pipeline\.push_every: .*pipeline"):
        make_spec({"pipeline.mode": "stream-async", "pipeline.push_every": 2})
    switched = override_spec(spec, ["pipeline.mode=disagg-sync"])
    assert switched.pipeline.push_every == 1 and controller_config(switched, 1).push_every == 1


def test_pipeline_pushes_every_k_steps_and_keeps_the_lag_bound():
    from helpers import small_spec

    from policies.records import SpanKind
    from sim.simulator import Simulation

    def run(every: int):
        spec = small_spec(pipeline__mode="pipeline", pipeline__max_lag=3,
                          pipeline__push_every=every, run__iterations=8)  # fmt: skip
        result = Simulation(spec).run()
        pushes = [
            s for s in result.spans if s.kind == SpanKind.WEIGHT_SYNC and s.resource == "gen-0"
        ]
        lags = [r.version_trained - r.version_start for r in result.samples]
        return len(pushes), lags, {r.version_start for r in result.samples}

    every_step, lags_1, served_1 = run(1)
    every_other, lags_2, served_2 = run(2)
    assert every_step == 7 and every_other == 3  # after steps 1..7; the last step pushes none
    assert max(lags_2) <= 3 and max(lags_1) <= 3  # the bound holds either way
    assert served_2 == {v for v in served_1 if v % 2 == 0} and len(served_1) > len(served_2)


@pytest.mark.parametrize(("every", "lag"), [(4, 2), (6, 4), (2, 0), (6, None)])
def test_a_push_interval_the_lag_bound_cannot_cover_is_refused_naming_both_keys(every, lag):
    """Servers ``every − 1`` versions behind can start no sample within ``max_lag``: the
    simulation used to stall (SimPy: no scheduled events left)."""
    overrides = {"pipeline.mode": "pipeline", "pipeline.push_every": every}
    if lag is not None:  # None: the default bound, 4
        overrides["pipeline.max_lag"] = lag
    with pytest.raises(SpecError, match=r"pipeline\.push_every: .*pipeline\.max_lag"):
        make_spec(overrides)


@pytest.mark.parametrize(("every", "lag"), [(2, 1), (3, 2), (5, 4), (1, 0)])
def test_a_push_interval_of_at_most_the_lag_plus_one_runs(every, lag):
    from helpers import small_spec

    from sim.simulator import Simulation

    spec = small_spec(pipeline__mode="pipeline", pipeline__max_lag=lag,
                      pipeline__push_every=every, run__iterations=6)  # fmt: skip
    result = Simulation(spec).run()
    assert max(r.version_trained - r.version_start for r in result.samples) <= lag


def test_more_lag_does_not_delay_the_first_step_when_lpt_orders_overlapping_batches():
    """streamrl-7b (LPT, trainer-bound): lag 4 starts five batches at once. Ordered by
    predicted length alone, every batch's long requests went ahead of the short ones the
    first step trains on, and it ended at 43.3 s against 30.1 s at lag 1; older batches
    first, it ends no later than at lag 1."""
    from sim.simulator import Simulation

    def first_step_end_s(lag: int) -> float:
        overrides = ["run.iterations=5", "pipeline.mode=pipeline", f"pipeline.max_lag={lag}"]
        result = Simulation(load_spec(config_path("streamrl-7b"), overrides)).run()
        return result.steps[0]["end_s"]

    assert first_step_end_s(4) <= first_step_end_s(1)
