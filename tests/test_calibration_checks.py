"""What a calibrated cost model prices, scales and refuses; what ``tandem calibrate`` and a
decode-table cost model reject (docs/fidelity.md, "Bringing your own profile")."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd
import pytest
from helpers import small_spec, write_cost_model, write_profile

from policies.protocols import Device
from sim.calibrated import CalibratedCostModel
from sim.cluster import check_sim_run
from sim.costs import build_cost_model
from sim.simulator import Simulation

# the profiled configuration: generation tp 1 on H800, a trainer of 2 H800
SETUP = {
    "model": {"name": "Qwen2.5-7B"},
    "hardware": {"kind": "H800", "tp": 1},
    "trainer": {"hardware": "H800", "num_gpus": 2},
}


def _cost_model(path: Path, source: dict | None = SETUP, **top: object) -> Path:
    """helpers.write_cost_model's tiny operators, with ``source`` as its profile.json."""
    write_cost_model(path)
    doc = json.loads((path / "cost_model.json").read_text())
    doc.update(top)
    if source is not None:
        doc["source"] = {"weight_bytes": 1e6, "kv_capacity_tokens": 100000, **source}
    (path / "cost_model.json").write_text(json.dumps(doc))
    return path


def _spec(cm: Path, **overrides: object):
    return small_spec(sim__cost_model=f"profiled:{cm}", **overrides)


# -- H1: what a calibrated model scales and refuses -----------------------------------------


def test_a_calibrated_job_pays_the_profiled_fixed_cost_once_per_micro_batch(tmp_path):
    """The profile timed one forward and one backward call per micro-batch, so a job of
    four micro-batches a GPU pays four calls' fixed terms (before: one per job)."""
    cost = CalibratedCostModel.load(_cost_model(tmp_path) / "cost_model.json")
    forward = lambda t: 0.01 + 5e-5 * t  # noqa: E731 - helpers.TINY_OPERATORS
    backward = lambda t: 0.01 + 8e-5 * t  # noqa: E731
    four = cost.train_s(Device("H800", 2), 1000, 4)
    assert four == pytest.approx(4 * (forward(250) + backward(250)))
    assert cost.train_s(Device("H800", 2), 1000) == pytest.approx(forward(1000) + backward(1000))
    # a tokens^2 term is in one call's tokens, not the job's
    quadratic = CalibratedCostModel.load(
        write_cost_model(tmp_path / "q", forward=(["tokens^2"], [1e-6]), backward=(["1"], [0.0]))
        / "cost_model.json"
    )
    assert quadratic.train_s(Device("cpu", 1), 1000, 4) == pytest.approx(4 * 1e-6 * 250**2)


def test_a_simulated_step_of_one_job_pays_a_fixed_cost_per_micro_batch(tmp_path):
    """disagg-sync trains a step as one job: 8 samples on the profiled 2 GPUs, 2 samples a
    GPU per micro-batch, so two calls a GPU: 2 × (0.01 + 0.01) s fixed (before: one call's)
    and the step's tokens as profiled. (A stream mode's jobs are one micro-batch a GPU.)"""
    spec = _spec(
        _cost_model(tmp_path), pipeline__mode="disagg-sync", algorithm__micro_batch_per_gpu=2
    )
    result = Simulation(spec).run()
    for step in result.steps:
        training_s = step["busy_s"] - step["optimizer_s"] - step["grad_sync_s"]
        per_token_s = (5e-5 + 8e-5) * step["num_tokens"]
        assert training_s == pytest.approx(2 * (0.01 + 0.01) + per_token_s, rel=1e-9)


def test_training_scales_from_the_profiled_trainer_gpus_by_data_parallelism(tmp_path):
    cost = CalibratedCostModel.load(_cost_model(tmp_path) / "cost_model.json")
    forward = lambda t: 0.01 + 5e-5 * t  # noqa: E731 - helpers.TINY_OPERATORS
    backward = lambda t: 0.01 + 8e-5 * t  # noqa: E731
    profiled = cost.train_s(Device("H800", 2), 1000)
    assert profiled == pytest.approx(forward(1000) + backward(1000))
    # 8 GPUs each hold a quarter of what one of the 2 profiled GPUs held
    assert cost.train_s(Device("H800", 8), 1000) == pytest.approx(forward(250) + backward(250))
    # the 12 ms step is below 7.6e9 parameters' Adam traffic on 2 H800s (36 ms): all of
    # it is work on the sharded state (tests/test_calibration_scale.py splits a slower one)
    cost = build_cost_model(_spec(_cost_model(tmp_path)))
    assert cost.optimizer_s(Device("H800", 8)) == pytest.approx(0.012 / 4)
    assert cost.optimizer_s(Device("H800", 2)) == pytest.approx(0.012)


def test_trainer_gpus_move_a_calibrated_runs_training_time(tmp_path):
    from sim.simulator import Simulation

    cm = _cost_model(tmp_path)
    busy = [
        Simulation(_spec(cm, cluster__trainer__num_gpus=n, pipeline__mode="disagg-sync"))
        .run()
        .metrics["trainer_utilization"]
        for n in (1, 4)
    ]
    assert busy[1] < busy[0] / 2


def test_a_cross_datacenter_link_is_priced_by_its_bandwidth(tmp_path):
    from sim.simulator import Simulation

    cm = _cost_model(tmp_path, weight_bytes=16e9)
    runs = {
        gbps: Simulation(
            _spec(
                cm,
                cluster__generation__0__datacenter="dc1",
                cluster__network__inter_dc_gbps=gbps,
                pipeline__mode="disagg-sync",
            )
        ).run()
        for gbps in (10.0, 400.0)
    }
    slow, fast = (runs[g].metrics["throughput_samples_per_s"] for g in (10.0, 400.0))
    assert fast > slow * 1.5  # 16 GB over 10 Gb/s is 12.8 s a push, 0.32 s over 400


def test_another_tp_than_profiled_is_refused_naming_the_key(tmp_path):
    spec = _spec(_cost_model(tmp_path), cluster__generation__0__tp=2)
    with pytest.raises(ValueError, match=r"^cluster\.generation\.0\.tp: 2, .*profiled at tp 1"):
        build_cost_model(spec)


def test_other_trainer_hardware_than_profiled_is_refused_naming_the_key(tmp_path):
    spec = _spec(_cost_model(tmp_path), cluster__trainer__hardware="A100-SXM-80GB")
    with pytest.raises(ValueError, match=r"^cluster\.trainer\.hardware: .*'H800' trainer"):
        build_cost_model(spec)


def test_an_older_project_profile_records_its_setup_in_its_spec():
    from policies.profile_source import ProfiledSetup

    root = Path(__file__).parent.parent / "docs/reports/fidelity-run14/profile/profile.json"
    setup = ProfiledSetup.of(json.loads(root.read_text()))
    assert (setup.generation_hardware, setup.generation_tp) == ("cpu", 1)
    assert (setup.trainer_hardware, setup.trainer_num_gpus) == ("cpu", 1)
    assert setup.unknown_keys() == []


def test_a_cost_model_without_its_setup_loads_with_a_warning(tmp_path, caplog):
    cm = _cost_model(tmp_path, source=None)
    with caplog.at_level(logging.WARNING):
        cost = build_cost_model(_spec(cm))
    assert "hardware.tp, trainer.hardware, trainer.num_gpus" in caplog.text
    assert cost.train_s(Device("H800", 8), 1000) == cost.train_s(Device("H800", 2), 1000)


def test_the_check_before_a_run_returns_that_warning_and_logs_nothing(tmp_path, caplog):
    """Seen: ``tandem run`` printed the warning twice, from its check and from the run."""
    cm = _cost_model(tmp_path, source=None)
    with caplog.at_level(logging.WARNING):
        warnings = check_sim_run(_spec(cm))
    assert any("trainer.num_gpus" in w for w in warnings)
    assert "trainer.num_gpus" not in caplog.text


def test_advise_on_a_calibrated_model_fixes_tp_at_the_profiled_one(tmp_path):
    from experiments.advise_plan import SpaceOptions, plan_space

    spec = _spec(_cost_model(tmp_path), cluster__generation__0__num_gpus=4)
    space = plan_space(spec, SpaceOptions(axes=("mode=disagg-sync", "tp=1,2,4")))
    assert space.axes.tps == (1,)
    assert {c.structure.tp for c in space.candidates} == {1}
    assert any("fixed at the profiled tp" in line for line in space.left_out)


# -- H2: a decode-table CSV cost model ------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batch_size,decode_step_ms\n1,-10\n64,13\n", r"row 1, column decode_step_ms: -10"),
        ("batch_size,decode_step_ms\n", r"no rows under the header"),
        ("batch_size,decode_step_ms\n1,10\n1,12\n", r"row 2, column batch_size: .*twice"),
        ("batch_size,decode_step_ms\n1,nan\n64,13\n", r"row 1, column decode_step_ms"),
        ("batch_size,decode_step_ms\n0,10\n64,13\n", r"row 1, column batch_size"),
        ("batch_size,decode_step_s\n1,0.01\n", r"missing column\(s\) decode_step_ms"),
    ],
)
def test_a_bad_decode_table_is_refused_before_the_run(tmp_path, text, message):
    table = tmp_path / "ptl.csv"
    table.write_text(text)
    with pytest.raises(ValueError, match=rf"sim\.cost_model: {table}: {message}"):
        check_sim_run(small_spec(sim__cost_model=f"profiled:{table}"))


def test_a_decode_table_that_is_not_text_is_named(tmp_path):
    table = tmp_path / "ptl.csv"
    table.write_bytes(b"\x00\x01batch_size\xff\xfe")
    with pytest.raises(ValueError, match=rf"^sim\.cost_model: {table}: not a CSV table"):
        check_sim_run(small_spec(sim__cost_model=f"profiled:{table}"))


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]"])
def test_a_cost_model_file_that_is_not_a_json_object_names_the_key(tmp_path, text):
    cm = _cost_model(tmp_path)
    (cm / "cost_model.json").write_text(text)
    match = rf"^sim\.cost_model: {cm}/cost_model\.json: not a tandem cost model"
    with pytest.raises(ValueError, match=match):
        build_cost_model(_spec(cm))


def test_a_bad_decode_table_leaves_no_run_directory(tmp_path, capsys):
    from experiments.cli import main

    table = tmp_path / "ptl.csv"
    table.write_text("batch_size,decode_step_ms\n")
    out = tmp_path / "run"
    assert main(["run", "--set", f"sim.cost_model=profiled:{table}", "--out", str(out)]) == 2
    assert not out.exists()


def test_a_decode_table_run_says_only_decode_is_measured(tmp_path):
    from sim.costs import describe_cost_model

    table = tmp_path / "ptl.csv"
    table.write_text("batch_size,decode_step_ms\n1,10\n64,13\n")
    line = describe_cost_model(small_spec(sim__cost_model=f"profiled:{table}"))
    assert "decode steps interpolated from the measured table" in line
    assert "calibrated on a measured profile" not in line


# -- M1-M3, L4: what tandem calibrate rejects ------------------------------------------------


def _profile(path: Path, **info: object) -> Path:
    """A consistent profile (tests/test_calibration.py's numbers) with profile.json keys
    replaced by ``info`` (None removes one)."""
    path.mkdir(parents=True, exist_ok=True)
    write_profile(path, SETUP, **info)
    return path


def _calibrate(profile: Path, notes: list[str] | None = None):
    from experiments.calibrate import calibrate

    note = None if notes is None else notes.append
    return calibrate(profile, profile.parent / "out", note=note)


def _edit(path: Path, column: str, row: int, value: object) -> None:
    frame = pd.read_csv(path)
    frame.loc[row, column] = value
    frame.to_csv(path, index=False)


@pytest.mark.parametrize(
    ("table", "column", "row", "value", "message"),
    [
        ("decode.csv", "step_s", 2, -0.01, r"decode.csv: row 3, column step_s: -0.01 is not positive"),
        ("decode.csv", "batch_size", 0, -1, r"decode.csv: row 1, column batch_size: -1"),
        ("train.csv", "forward_s", 1, 0.0, r"train.csv: row 2, column forward_s: 0.0 is not positive"),
        ("weight_sync.csv", "num_bytes", 0, -5, r"weight_sync.csv: row 1, column num_bytes"),
    ],
)  # fmt: skip
def test_a_non_positive_measurement_is_an_error_naming_file_row_and_column(
    tmp_path, table, column, row, value, message
):
    profile = _profile(tmp_path / "p")
    _edit(profile / table, column, row, value)
    with pytest.raises(ValueError, match=message):
        _calibrate(profile)


def test_a_decode_step_in_milliseconds_is_warned_of(tmp_path):
    profile = _profile(tmp_path / "p")
    frame = pd.read_csv(profile / "decode.csv")
    frame["step_s"] *= 1000
    frame.to_csv(profile / "decode.csv", index=False)
    notes: list[str] = []
    _calibrate(profile, notes)
    assert any("column step_s" in n and "in seconds" in n for n in notes)


def test_a_decode_table_of_one_batch_size_is_refused(tmp_path):
    profile = _profile(tmp_path / "p")
    _edit(profile / "decode.csv", "batch_size", slice(None), 8)
    with pytest.raises(ValueError, match=r"decode.csv: column batch_size: .*at least 2 distinct"):
        _calibrate(profile)


def test_every_transfer_shorter_than_its_pause_is_refused(tmp_path):
    profile = _profile(tmp_path / "p")
    _edit(profile / "weight_sync.csv", "transfer_s", slice(None), 0.05)
    with pytest.raises(ValueError, match=r"weight_sync.csv: columns transfer_s, pause_s"):
        _calibrate(profile)


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"hardware": {"kind": "H100", "tp": 1}}, r"hardware.kind 'H100' is unknown; known: .*H100-SXM"),
        ({"hardware": None}, r"profile.json: no hardware.kind, hardware.tp"),
        ({"model": None}, r"profile.json: no model.name"),
        ({"trainer": None}, r"profile.json: no trainer.hardware, trainer.num_gpus"),
        ({"kv_capacity_tokens": -5}, r"kv_capacity_tokens is -5, not a positive number"),
        ({"weight_bytes": 0}, r"weight_bytes is 0, not a positive number"),
    ],
)  # fmt: skip
def test_an_incomplete_or_implausible_profile_json_is_refused_naming_the_key(
    tmp_path, info, message
):
    with pytest.raises(ValueError, match=message):
        _calibrate(_profile(tmp_path / "p", **info))


def test_calibrate_writes_what_the_profile_measured_into_the_cost_model(tmp_path):
    _calibrate(_profile(tmp_path / "p"))
    cost = CalibratedCostModel.load(tmp_path / "out" / "cost_model.json")
    assert (cost.setup.generation_tp, cost.setup.trainer_num_gpus) == (1, 2)


def test_a_failing_kv_check_on_a_calibrated_model_names_its_kv_capacity(tmp_path):
    cm = _cost_model(tmp_path, kv_capacity_tokens=300)
    with pytest.raises(ValueError, match=r"^sim\.cost_model: .*kv_capacity_tokens 300"):
        check_sim_run(_spec(cm))


def test_calibrate_names_a_directory_that_does_not_exist(tmp_path, capsys):
    from experiments.cli import main

    assert main(["calibrate", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 2
    assert f"{tmp_path / 'nope'}: no such directory" in " ".join(capsys.readouterr().out.split())


# -- M4, L3: naming and paths -----------------------------------------------------------------


def test_an_uncalibrated_profile_directory_says_to_calibrate_it(tmp_path):
    profile = _profile(tmp_path / "p")
    with pytest.raises(ValueError, match=r"^sim\.cost_model: .*run tandem calibrate .*--out"):
        build_cost_model(_spec(profile))


def test_a_relative_cost_model_path_is_saved_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = small_spec(sim__cost_model="profiled:cm-h100")
    assert spec.sim.cost_model == f"profiled:{tmp_path / 'cm-h100'}"


def test_calibrate_suggests_an_absolute_path(tmp_path, monkeypatch, capsys):
    from experiments.cli import main

    _profile(tmp_path / "p")
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "p", "--out", "cm"]) == 0
    said = "".join(capsys.readouterr().out.split())
    assert f"sim.cost_model=profiled:{tmp_path / 'cm'}" in said
