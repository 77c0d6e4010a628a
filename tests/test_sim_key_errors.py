"""What the simulator refuses about a cluster names the spec key to change (in ``--set``'s
form), never only the value: unknown hardware, a model that does not fit its tp, a KV
cache smaller than one sequence."""

from __future__ import annotations

import pytest
from helpers import small_spec

from experiments.cli import main
from sim.cluster import check_sim_run
from sim.simulator import Simulation
from sim.tables import hardware_table

TWO_POOLS = [{"hardware": "H800", "num_gpus": 2}, {"hardware": "H20", "num_gpus": 2}]


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"cluster__generation__0__hardware": "B200"}, "cluster.generation.0.hardware"),
        ({"cluster__generation": TWO_POOLS, "cluster__generation__1__hardware": "B200"},
         "cluster.generation.1.hardware"),
        ({"cluster__trainer__hardware": "B200"}, "cluster.trainer.hardware"),
    ],
)  # fmt: skip
def test_unknown_hardware_names_the_key_and_the_known_hardware(overrides, key):
    with pytest.raises(ValueError, match=rf"^{key}: unknown hardware 'B200'") as info:
        Simulation(small_spec(**overrides)).run()
    assert all(name in str(info.value) for name in hardware_table())


def test_a_model_that_does_not_fit_its_tp_names_the_tp_key():
    spec = small_spec(model__name="Qwen2.5-72B", cluster__generation__0__tp=1)
    with pytest.raises(ValueError, match=r"^cluster\.generation\.0\.tp: .*does not fit"):
        Simulation(spec).run()


def test_a_kv_cache_smaller_than_one_sequence_names_the_override():
    spec = small_spec(cluster__generation__0__num_gpu_blocks_override=6)
    with pytest.raises(
        ValueError,
        match=r"^cluster\.generation\.0\.num_gpu_blocks_override: the longest prompt with "
        r"its max_tokens \(\d+ tokens, \d+ blocks\) does not fit",
    ):
        Simulation(spec).run()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.generation.0.num_gpu_blocks_override=6",
         "cluster.generation.0.num_gpu_blocks_override"),
        ("cluster.generation.0.hardware=B200", "cluster.generation.0.hardware"),
    ],
)  # fmt: skip
def test_tandem_run_refuses_before_making_the_run_directory(tmp_path, capsys, override, key):
    out = tmp_path / "run"
    assert main(["run", "--set", override, "--out", str(out)]) == 2
    assert key in capsys.readouterr().out
    assert not out.exists()


@pytest.mark.parametrize(
    ("cluster", "named"),
    [
        ({"cluster__generation": TWO_POOLS}, "cluster.generation.1 is H20 in dc0"),
        ({"cluster__trainer__datacenter": "dc1"}, "cluster.trainer is H800 in dc1"),
    ],
)
def test_a_colocated_mode_refuses_gpus_of_several_kinds_or_places(cluster, named):
    """Before: every GPU ran as the first pool's hardware, in its datacenter, silently."""
    spec = small_spec(pipeline__mode="colocated-sync", **cluster)
    with pytest.raises(ValueError, match=rf"^pipeline\.mode: colocated-sync .* {named}, "):
        check_sim_run(spec)


def test_a_trainer_too_small_for_the_weights_and_gradients_is_refused():
    """Before: 72B trained on one 80 GB H800 at 0.37 samples/s."""
    spec = small_spec(model__name="Qwen2.5-72B", cluster__generation__0__tp=4,
                      cluster__generation__0__num_gpus=4, cluster__trainer__num_gpus=1)  # fmt: skip
    # 4 bytes a parameter: 72.7e9 × 4 / 80e9 → 4 GPUs
    with pytest.raises(ValueError, match=r"^cluster\.trainer\.num_gpus: 1 H800 GPU\(s\) "
                       r"cannot hold Qwen2.5-72B's .* it needs at least 4$"):  # fmt: skip
        check_sim_run(spec)
    check_sim_run(spec.model_copy(update={"cluster": _trainer_gpus(spec, 4)}))


def test_a_trainer_that_fits_only_with_its_optimizer_offloaded_is_warned_about(caplog):
    spec = small_spec(cluster__trainer__num_gpus=1)  # 7B: 30 GB on the GPU, 122 GB in all
    with caplog.at_level("WARNING", logger="sim.cluster"):
        Simulation(spec).run()
    assert "only with the optimizer offloaded" in caplog.text and "2 hold it all" in caplog.text


def test_balanced_allocation_leaves_the_trainer_the_gpus_its_memory_needs():
    from policies.allocation import BalancedAllocation
    from policies.stage_model import StageModel
    from sim.cluster import min_trainer_gpus
    from sim.costs import build_cost_model

    # the trainer in another datacenter: balanced shrinks the faster stage, here training
    spec = small_spec(model__name="Qwen2.5-32B", cluster__generation__0__tp=2,
                      cluster__generation__0__num_gpus=2, cluster__trainer__num_gpus=8,
                      cluster__trainer__datacenter="dc1")  # fmt: skip
    cost = build_cost_model(spec)
    floor = min_trainer_gpus(cost, "H800")
    assert floor == 2  # 32.8e9 × 4 bytes over 80 GB
    model = StageModel(cost, batch_size=8, prompt_tokens=100.0, output_tokens=[2000] * 64,
                       micro_batch_per_gpu=1)  # fmt: skip
    unbounded = BalancedAllocation().allocate(spec.cluster, model)
    assert unbounded.trainer.num_gpus == 1  # generation-bound: the trainer shrinks to 1
    model.min_trainer_gpus = floor
    bounded = BalancedAllocation().allocate(spec.cluster, model)
    assert bounded.trainer.num_gpus == floor


def _trainer_gpus(spec, n):
    return spec.cluster.model_copy(
        update={"trainer": spec.cluster.trainer.model_copy(update={"num_gpus": n})}
    )


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("sim.hardware=[{name: H800, hbm_tb_per_s: 2000}]",
         "sim.hardware.0.hbm_tb_per_s: 2000 TB/s is beyond any GPU: the unit is TB/s"),
        ("sim.efficiency.step_overhead_s=4.06",
         "sim.efficiency.step_overhead_s: 4.06 s an engine step is beyond any engine"),
    ],
)  # fmt: skip
def test_a_figure_in_the_wrong_unit_is_refused_saying_the_unit(override, said, capsys):
    # GB/s typed as TB/s, milliseconds as seconds: both ran, at 12.3 and 0.017 samples/s
    assert main(["run", "streamrl-7b", "--set", override]) == 2
    assert said in " ".join(capsys.readouterr().out.split())


def test_a_tp_that_cannot_shard_the_heads_names_the_pools_tp_key():
    """Seen: "cluster.generation tp 7: ...", not the key to change."""
    spec = small_spec(cluster__generation__0__tp=7, cluster__generation__0__num_gpus=14)
    with pytest.raises(ValueError, match=r"^cluster\.generation\.0\.tp: .*4 KV heads"):
        check_sim_run(spec)
