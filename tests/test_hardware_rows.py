"""``sim.hardware``: a user's own GPU, or a price for one hardware.csv lists without it.

Seen: H100-SXM, H200 and A100 have no price in hardware.csv, so ``cost_normalized_throughput``
was "—" and ``advise --objective cost-normalized`` refused them, and a GPU hardware.csv does
not list could not be simulated at all; nothing in a spec could supply either."""

from __future__ import annotations

import pytest
from helpers import small_spec

from experiments.cli import main
from policies.spec import SpecError
from sim.simulator import Simulation
from sim.tables import hardware_of

H800_FIGURES = {
    "bf16_dense_tflops": 989.5, "hbm_gb": 80, "hbm_tb_per_s": 3.35, "nvlink_gb_per_s": 400,
    "cost_per_machine_rel_h20": 2.85,
}  # fmt: skip


def _spec(hardware: str, rows: list[dict]) -> object:
    return small_spec(
        run__iterations=2, cluster__generation__0__hardware=hardware,
        cluster__trainer__hardware=hardware, sim__hardware=rows,
    )  # fmt: skip


def test_a_gpu_given_with_h800s_figures_simulates_exactly_as_the_h800():
    h800 = Simulation(_spec("H800", [])).run().metrics
    mine = Simulation(_spec("MyGPU", [{"name": "MyGPU", **H800_FIGURES}])).run().metrics
    for key in ("throughput_samples_per_s", "cost_normalized_throughput", "makespan_s"):
        assert mine[key] == h800[key], key


def test_a_price_for_a_listed_gpu_prices_the_run_and_changes_nothing_else():
    plain = Simulation(_spec("H100-SXM", [])).run().metrics
    rows = [{"name": "H100-SXM", "cost_per_machine_rel_h20": 3.2}]
    priced = Simulation(_spec("H100-SXM", rows)).run().metrics
    assert plain["cost_normalized_throughput"] is None
    assert priced["throughput_samples_per_s"] == plain["throughput_samples_per_s"]
    spec = _spec("H100-SXM", rows)
    gpus = sum(p.num_gpus for p in spec.cluster.generation) + spec.cluster.trainer.num_gpus
    units = gpus * 3.2 / 8  # an 8-GPU machine's cost in H20 machines, per GPU
    assert priced["cost_normalized_throughput"] == pytest.approx(
        priced["throughput_samples_per_s"] / units
    )


def test_a_figure_given_replaces_the_listed_ones_and_moves_the_run():
    """Twice the memory bandwidth: decode (memory-bound) is faster, the run is too."""
    base = Simulation(_spec("H800", [])).run().metrics
    faster = Simulation(_spec("H800", [{"name": "H800", "hbm_tb_per_s": 6.7}])).run().metrics
    assert faster["throughput_samples_per_s"] > base["throughput_samples_per_s"]
    table = hardware_of(_spec("H800", [{"name": "H800", "hbm_tb_per_s": 6.7}]))
    assert table["H800"].hbm_bytes_per_s == 6.7e12 and table["H800"].hbm_bytes == 80e9


def test_a_new_gpu_missing_a_figure_is_refused_naming_it_before_out(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["run", "--set", "cluster.generation.0.hardware=MI300X", "--set",
            "sim.hardware=[{name: MI300X, bf16_dense_tflops: 1307, hbm_gb: 192}]",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 2
    printed = " ".join(capsys.readouterr().out.split())
    assert "sim.hardware.0.hbm_tb_per_s: 'MI300X' is not in hardware.csv" in printed
    assert "nvlink_gb_per_s" in printed and not out.exists()


def test_a_gpu_given_twice_or_a_bad_figure_is_a_spec_error():
    with pytest.raises(SpecError, match="sim.hardware: .*'H800' is given more than once"):
        small_spec(sim__hardware=[{"name": "H800"}, {"name": "H800", "hbm_gb": 1}])
    with pytest.raises(SpecError, match="sim.hardware.0.hbm_gb"):
        small_spec(sim__hardware=[{"name": "H800", "hbm_gb": -1}])
