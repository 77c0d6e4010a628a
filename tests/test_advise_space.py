"""The space ``tandem advise`` searches: every candidate a valid spec within the constraints,
equivalent points once, the input always inside, per-datacenter placement, axis errors."""

from __future__ import annotations

from collections import Counter

import pytest

from experiments.advise_plan import SpaceOptions, plan_space
from experiments.advise_space import Inventory, candidate_spec
from policies.modes import MODES
from policies.spec import RunSpec, SpecError, spec_from_dict


def small_spec(**pipeline: object) -> RunSpec:
    return spec_from_dict({
        "run": {"name": "small", "iterations": 4, "seed": 0},
        "model": {"name": "Qwen2.5-7B"},
        "cluster": {
            "generation": [{"hardware": "H800", "num_gpus": 8, "tp": 1, "max_num_seqs": 32}],
            "trainer": {"hardware": "H800", "num_gpus": 8},
        },
        "workload": {"kind": "histogram", "max_output_tokens": 2000, "num_prompts": 256},
        "algorithm": {"name": "ppo", "batch_size": 64, "group_size": 1},
        "pipeline": {"mode": "stream-async", **pipeline},
        "policies": {"dispatch": "skewness-aware", "scheduling": "lpt",
                     "length_predictor": "oracle", "allocation": "balanced"},
    })  # fmt: skip


def test_every_candidate_is_a_valid_spec_within_the_staleness_bound():
    space = plan_space(small_spec(), SpaceOptions(axes=("dispatch=least-loaded",)))
    assert space.axes.max_staleness == 1  # the input's own (stream-async)
    for c in space.candidates:
        spec = candidate_spec(space.base, c)
        p = spec.pipeline
        assert MODES.get(p.mode).staleness_bound(p.max_lag, p.steps_per_generation) <= 1
        assert spec.policies.allocation == "fixed"
        pools = spec.cluster.generation
        assert all(p.num_gpus % p.tp == 0 and p.tp == c.structure.tp for p in pools)
        if not c.structure.colocated:  # every GPU of the inventory placed
            assert sum(p.num_gpus for p in pools) + spec.cluster.trainer.num_gpus == 16


def test_equivalent_points_are_enumerated_once():
    space = plan_space(small_spec(), SpaceOptions())
    cands = space.candidates
    assert len(set(cands)) == len(cands)
    # no length predictor: lpt orders like fcfs, so only one of them appears
    assert not [
        c for c in cands if c.policies.predictor == "none" and c.policies.scheduling == "lpt"
    ]
    colocated = Counter(
        (c.structure.tp, c.structure.max_num_seqs, c.policies)
        for c in cands
        if c.structure.colocated
    )
    assert colocated and set(colocated.values()) == {1}


def test_skewness_aware_dispatch_is_never_searched_without_a_length_predictor():
    space = plan_space(small_spec(), SpaceOptions(axes=("mode=stream-async", "tp=1,4")))
    policies = {c.policies for c in space.candidates}
    assert {p.predictor for p in policies} == {"none", "oracle"}
    assert "skewness-aware" in {p.dispatch for p in policies}
    assert not [p for p in policies if p.dispatch == "skewness-aware" and p.predictor == "none"]
    one_instance = [c for c in space.candidates if c.structure.num_instances == 1]
    assert one_instance  # there every dispatch is alike: the one kept suits the predictor
    for c in space.candidates:
        candidate_spec(space.base, c)  # validates


def test_the_input_is_a_candidate_with_its_resolved_split():
    space = plan_space(small_spec(), SpaceOptions())
    assert space.input in space.candidates and not space.input_outside
    s = space.input.structure
    assert (s.mode, s.tp, s.max_num_seqs) == ("stream-async", 1, 32)
    assert s.trainer_gpus + sum(s.generation_gpus) == 16  # balanced's split, whatever it is
    assert space.input.policies.key == "skewness-aware/lpt/oracle"


def test_max_staleness_filters_modes_and_lags():
    strict = plan_space(small_spec(), SpaceOptions(max_staleness=0))
    assert {c.structure.staleness_bound for c in strict.candidates} == {0}
    assert "pipeline" not in {c.structure.mode for c in strict.candidates}
    assert strict.input_outside  # stream-async has staleness 1
    loose = plan_space(small_spec(), SpaceOptions(max_staleness=4, axes=("dispatch=round-robin",)))
    lags = {
        (c.structure.mode, c.structure.lag) for c in loose.candidates if c.structure.lag is not None
    }
    # conventional needs steps_per_generation (lag + 1) to divide the 4 iterations
    assert lags == {("pipeline", 1), ("pipeline", 2), ("pipeline", 4), ("conventional", 1)}


def test_axes_restrict_the_space():
    space = plan_space(
        small_spec(),
        SpaceOptions(axes=("mode=pipeline", "tp=2", "max_num_seqs=16,64", "predictor=none")),
    )
    assert {c.structure.mode for c in space.candidates} <= {"pipeline", "stream-async"}  # + input
    others = [c for c in space.candidates if c != space.input]
    assert {c.structure.tp for c in others} == {2}
    assert {c.structure.max_num_seqs for c in others} == {16, 64}


@pytest.mark.parametrize(
    ("axis", "message"),
    [
        ("colour=red", "unknown axis 'colour'"),
        ("dispatch=fastest", "unknown dispatch 'fastest'"),
        ("tp=two", "tp takes positive integers"),
        ("tp", "must look like name=v1,v2"),
        ("split_parts=0", "split_parts takes one positive integer"),
    ],
)
def test_bad_axes_are_errors_naming_the_axis(axis, message):
    with pytest.raises(SpecError, match=message):
        plan_space(small_spec(), SpaceOptions(axes=(axis,)))


def test_axes_that_leave_no_valid_policy_are_an_error_saying_why():
    """Before: the search ran on the input spec alone ('1 candidates, 100% covered')."""
    axes = ("dispatch=skewness-aware", "predictor=none")
    with pytest.raises(SpecError, match="needs a length predictor other than none"):
        plan_space(small_spec(), SpaceOptions(axes=axes))


def test_a_tp_axis_that_fits_nowhere_is_an_error_saying_why():
    """Seen: ``--axis tp=3`` (28 heads do not split in 3) collapsed the space to the input
    alone: '1 candidates, 100% covered'."""
    with pytest.raises(SpecError, match=r"tp 3: none fits .*28 attention heads"):
        plan_space(small_spec(), SpaceOptions(axes=("tp=3",)))
    space = plan_space(small_spec(), SpaceOptions(axes=("tp=2,3", "mode=pipeline")))
    assert {c.structure.tp for c in space.candidates if c != space.input} == {2}
    # the tp that fits nowhere is said, not dropped without a word
    assert len(space.left_out) == 1
    assert space.left_out[0].startswith("tp 3 on H800: cannot shard")


def test_bad_options_are_errors():
    with pytest.raises(ValueError, match="--objective"):
        SpaceOptions(objective="latency")
    with pytest.raises(ValueError, match="--max-staleness"):
        SpaceOptions(max_staleness=-1)


def test_two_datacenters_search_where_the_trainer_sits():
    data = small_spec().model_dump(mode="json")
    data["cluster"]["generation"] = [
        {"hardware": "H800", "num_gpus": 8, "tp": 2, "datacenter": "dc0", "max_num_seqs": 32},
        {"hardware": "H20", "num_gpus": 8, "tp": 2, "datacenter": "dc1", "max_num_seqs": 32},
    ]
    data["policies"]["allocation"] = "fixed"
    base = spec_from_dict(data)
    inv = Inventory.of(base)
    assert [(g.hardware, g.datacenter, g.num_gpus) for g in inv.groups] == [
        ("H800", "dc0", 16), ("H20", "dc1", 8)
    ]  # fmt: skip
    space = plan_space(base, SpaceOptions(axes=("dispatch=round-robin", "predictor=oracle")))
    groups = {c.structure.trainer_group for c in space.candidates}
    assert groups == {0, 1}
    assert not [c for c in space.candidates if c.structure.colocated]  # one group only
    for c in space.candidates:
        spec = candidate_spec(base, c)
        dcs = {p.datacenter for p in spec.cluster.generation}
        trainer_dc = spec.cluster.trainer.datacenter
        assert trainer_dc == inv.groups[c.structure.trainer_group].datacenter
        if c.structure.trainer_group == 1:  # trainer in dc1: all of dc0 generates
            assert "dc0" in dcs and spec.cluster.trainer.hardware == "H20"


def test_cost_normalized_also_leaves_gpus_idle():
    full = plan_space(small_spec(), SpaceOptions(axes=("dispatch=round-robin",)))
    partial = plan_space(
        small_spec(), SpaceOptions(objective="cost-normalized", axes=("dispatch=round-robin",))
    )
    assert {c.structure.num_gpus for c in full.candidates} == {16}
    assert min(c.structure.num_gpus for c in partial.candidates) < 16


def test_no_candidate_trains_on_fewer_gpus_than_hold_the_weights_and_gradients():
    """Before: 72B PPO (two trained models, 582 GB of bf16 weights and gradients) was
    searched with trainers of 1–7 H800, which the simulator now refuses."""
    base = small_spec().model_copy(deep=True)
    base.model.name = "Qwen2.5-72B"
    base = spec_from_dict(base.model_dump(mode="json"))
    space = plan_space(base, SpaceOptions(axes=("mode=stream-async", "tp=4", "split_parts=16")))
    trainers = {c.structure.trainer_gpus for c in space.candidates}
    assert trainers and min(trainers) == 8  # 2 × 72.7e9 × 4 bytes over 80 GB
    assert "a trainer of fewer than 8 H800: cannot hold the model's weights and gradients" in (
        space.left_out
    )


def test_cost_normalized_names_the_hardware_hardware_csv_prices_no_machine_of():
    """Before: 'needs every GPU's cost' without naming the hardware that lacks one."""
    spec = small_spec().model_copy(deep=True)
    spec.cluster.trainer.hardware = "H100-SXM"
    spec = RunSpec.model_validate(spec.model_dump())
    with pytest.raises(ValueError, match="no cost_per_machine_rel_h20 for H100-SXM .give it with"):
        plan_space(spec, SpaceOptions(objective="cost-normalized", axes=("dispatch=round-robin",)))


def test_a_lag_over_the_staleness_bound_is_refused_not_dropped():
    """Before: --axis lag=7 under the input's bound of 1 vanished from the space unsaid."""
    with pytest.raises(SpecError, match=r"lag 7 trains on samples up to 7 steps stale, over "
                       r"--max-staleness 1"):  # fmt: skip
        plan_space(small_spec(), SpaceOptions(axes=("lag=1,7",)))
    wide = plan_space(small_spec(), SpaceOptions(max_staleness=7, axes=("lag=1,7",)))
    assert 7 in {c.structure.lag for c in wide.candidates}


def test_a_ranker_files_candidates_without_the_ranker_do_not_name_the_file(tmp_path):
    """Seen: advise on a spec with ``policies.ranker_path`` spent 672 of 705 runs on
    ``none``-predictor candidates its own spec refused (ranker_path needs the ranker)."""
    data = small_spec().model_dump(mode="json")
    data["policies"].update(length_predictor="ranker", ranker_path=str(tmp_path / "my.ranker"))
    base = spec_from_dict(data)
    space = plan_space(base, SpaceOptions(axes=("dispatch=least-loaded",)))
    predictors = Counter(c.policies.predictor for c in space.candidates)
    assert set(predictors) == {"ranker", "none"}
    for c in space.candidates:
        policies = candidate_spec(space.base, c).policies
        ranked = c.policies.predictor == "ranker"
        assert policies.ranker_path == (str(tmp_path / "my.ranker") if ranked else None)


def test_a_tp_left_out_is_said_once_however_many_datacenters_hold_the_hardware():
    # seen: "tp 3 on H800: ..." once per datacenter's group of H800 GPUs
    two_dcs = small_spec().model_dump()
    pool = two_dcs["cluster"]["generation"][0]
    two_dcs["cluster"]["generation"] = [pool, {**pool, "datacenter": "dc1"}]
    two_dcs["policies"]["allocation"] = "fixed"
    space = plan_space(spec_from_dict(two_dcs), SpaceOptions(axes=("tp=1,3",)))
    said = [line for line in space.left_out if line.startswith("tp 3 on H800")]
    assert len(said) == 1
