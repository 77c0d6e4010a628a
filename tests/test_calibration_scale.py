"""A calibrated cost model at scale: the trainer's memory is checked as the roofline model
checks it, the profiled optimizer step's overhead does not spread over trainer GPUs, a
decode table that says what it measured is checked against the spec, and a relative
``live.cost_model`` is saved absolute (docs/fidelity.md)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from helpers import small_spec, write_cost_model

from policies.protocols import Device
from sim.calibrated import CalibratedCostModel
from sim.cluster import check_sim_run, check_trainer_memory
from sim.costs import build_cost_model

# generation tp 1 on H800, a trainer of 2 H800 (tests/test_calibration_checks.py's)
SETUP = {"hardware": {"kind": "H800", "tp": 1}, "trainer": {"hardware": "H800", "num_gpus": 2}}


def _cost_model(path: Path, model: str, weight_bytes: float = 1e6, **operators) -> Path:
    write_cost_model(path, **operators)
    doc = json.loads((path / "cost_model.json").read_text())
    doc["weight_bytes"] = weight_bytes
    doc["source"] = {"model": {"name": model}, "weight_bytes": weight_bytes, **SETUP}
    (path / "cost_model.json").write_text(json.dumps(doc))
    return path


def _spec(cm: Path, model: str, **overrides: object):
    return small_spec(sim__cost_model=f"profiled:{cm}", model__name=model, **overrides)


# -- the trainer's memory ---------------------------------------------------------------------


def test_a_calibrated_trainer_too_small_for_the_weights_is_refused_as_the_rooflines(tmp_path):
    model = "Llama-3.1-70B"  # 70.6e9 parameters: 4 bytes each need 4 H800s
    calibrated = build_cost_model(_spec(_cost_model(tmp_path, model), model))
    roofline = build_cost_model(small_spec(model__name=model))
    said = []
    for cost in (calibrated, roofline):
        with pytest.raises(ValueError, match=r"^cluster\.trainer\.num_gpus: 2 H800 GPU") as err:
            check_trainer_memory(cost, "H800", 2)
        said.append(str(err.value))
    assert said[0] == said[1]
    assert "cannot hold Llama-3.1-70B's bf16 weights and gradients" in said[0]
    assert "it needs at least 4" in said[0]


def test_a_calibrated_trainer_holding_its_optimizer_only_offloaded_is_warned_of(tmp_path):
    model = "Qwen2.5-7B"  # 16 bytes a parameter: 122 GB, more than one H800's 80 GB
    cm = _cost_model(tmp_path, model)
    warned = check_sim_run(_spec(cm, model, cluster__trainer__num_gpus=1))
    offloaded = [w for w in warned if "only with the optimizer offloaded" in w]
    assert offloaded == [
        check_trainer_memory(build_cost_model(small_spec(model__name=model)), "H800", 1)
    ]
    assert offloaded[0].startswith("cluster.trainer.num_gpus: 1 H800 GPU(s) hold Qwen2.5-7B's")


def test_a_model_models_csv_does_not_list_takes_its_parameters_from_weight_bytes(tmp_path):
    # 200 GB of bf16 weights: 1e11 parameters, whose weights and gradients need 5 H800s
    cm = _cost_model(tmp_path, "my-100b", weight_bytes=200e9)
    with pytest.raises(ValueError, match=r"cannot hold my-100b's .* it needs at least 5$"):
        check_sim_run(_spec(cm, "my-100b"))


# -- the optimizer step over trainer GPUs -----------------------------------------------------


def test_the_optimizer_steps_overhead_does_not_spread_over_trainer_gpus(tmp_path):
    # Qwen2.5-7B's Adam traffic on the profiled 2 H800s is at least 32 B x 7.62e9 / (2 x
    # 3.35 TB/s) = 36.4 ms; the rest of a 100 ms step is per-step overhead
    cm = _cost_model(tmp_path, "Qwen2.5-7B", optimizer=(["1"], [0.1]))
    cost = build_cost_model(_spec(cm, "Qwen2.5-7B"))
    state_s = 32 * 7.62e9 / (2 * 3.35e12)
    assert cost.optimizer_s(Device("H800", 2)) == pytest.approx(0.1)
    assert cost.optimizer_s(Device("H800", 8)) == pytest.approx(0.1 - state_s + state_s / 4)


def test_an_optimizer_step_of_unknown_state_is_all_overhead(tmp_path):
    """Loaded without a spec (or profiled on a trainer hardware.csv does not list, a CPU),
    nothing bounds the state's share: the measured step stays on any number of GPUs."""
    cost = CalibratedCostModel.load(_cost_model(tmp_path, "Qwen2.5-7B") / "cost_model.json")
    assert cost.optimizer_s(Device("H800", 8)) == pytest.approx(0.012)
    assert cost.optimizer_s(Device("H800", 1)) == pytest.approx(0.012)


# -- a decode table that says what it measured ------------------------------------------------


@pytest.mark.parametrize(
    ("columns", "row", "message"),
    [
        ("model", "Llama-3.1-8B", r"model\.name: 'Qwen2\.5-7B', but the decode table .* model"),
        ("hardware", "A100-SXM-80GB", r"cluster\.generation\.0\.hardware: 'H800', but the deco"),
        ("tp", "2", r"cluster\.generation\.0\.tp: 1, but the decode table .* with tp '2'"),
    ],
)
def test_a_decode_table_of_another_setup_is_refused(tmp_path, columns, row, message):
    table = tmp_path / "ptl.csv"
    table.write_text(f"batch_size,decode_step_ms,{columns}\n1,10,{row}\n64,13,{row}\n")
    with pytest.raises(ValueError, match=message) as err:
        check_sim_run(small_spec(sim__cost_model=f"profiled:{table}"))
    assert str(table) in str(err.value)


def test_a_decode_table_column_of_two_values_is_refused(tmp_path):
    table = tmp_path / "ptl.csv"
    table.write_text("batch_size,decode_step_ms,hardware\n1,10,H800\n64,13,H20\n")
    with pytest.raises(ValueError, match=rf"^sim\.cost_model: {table}: row 2, column hardware"):
        check_sim_run(small_spec(sim__cost_model=f"profiled:{table}"))


def test_only_a_decode_table_that_names_no_setup_is_warned_of(tmp_path, caplog):
    old, new = tmp_path / "old.csv", tmp_path / "new.csv"
    old.write_text("batch_size,decode_step_ms\n1,10\n64,13\n")
    new.write_text(
        "batch_size,decode_step_ms,model,hardware,tp\n1,10,Qwen2.5-7B,h800,1\n64,13,Qwen2.5-7B,h800,1\n"
    )
    with caplog.at_level(logging.WARNING):
        build_cost_model(small_spec(sim__cost_model=f"profiled:{old}"))
        build_cost_model(small_spec(sim__cost_model=f"profiled:{new}"))
    said = [r.getMessage() for r in caplog.records if "decode_table" in r.name]
    assert len(said) == 1
    assert str(old) in said[0] and "no column(s) model, hardware, tp" in said[0]


# -- live.cost_model ---------------------------------------------------------------------------


def test_a_relative_live_cost_model_path_is_saved_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert small_spec(live__cost_model="cm-h100").live.cost_model == str(tmp_path / "cm-h100")
