"""What the simulator refuses about a cluster names the spec key to change (in ``--set``'s
form), never only the value: unknown hardware, a model that does not fit its tp, a KV
cache smaller than one sequence."""

from __future__ import annotations

import pytest
from helpers import small_spec

from experiments.cli import main
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
