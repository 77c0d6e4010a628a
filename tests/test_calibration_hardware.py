"""A profile measured on a GPU hardware.csv does not list: ``tandem calibrate`` learns it
from a spec's ``sim.hardware`` (``--spec`` / ``--set``), as the run that prices with the
cost model does (docs/fidelity.md, "Bringing your own profile")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers import small_spec, write_profile

from experiments.cli import main

MYGPU = {
    "name": "MYGPU", "bf16_dense_tflops": 600, "hbm_gb": 96, "hbm_tb_per_s": 4.0,
    "nvlink_gb_per_s": 600,
}  # fmt: skip
ROWS = f"sim.hardware=[{json.dumps(MYGPU)}]"


def _spec(**overrides: object):
    return small_spec(
        cluster__generation__0__hardware="MYGPU", cluster__trainer__hardware="MYGPU",
        sim__hardware=[MYGPU], **overrides,
    )  # fmt: skip


def _profile(path: Path) -> Path:
    spec = _spec()
    setup = {
        "model": {"name": spec.model.name},
        "hardware": {"kind": "MYGPU", "tp": spec.cluster.generation[0].tp},
        "trainer": {"hardware": "mygpu", "num_gpus": 2},  # any case, as the run compares
    }
    path.mkdir(parents=True)
    write_profile(path, setup)
    return path


def _said(capsys) -> str:
    return " ".join(capsys.readouterr().out.split())


def test_calibrate_refuses_an_unknown_gpu_naming_the_option(tmp_path, capsys):
    profile = _profile(tmp_path / "prof")
    assert main(["calibrate", str(profile), "--out", str(tmp_path / "cm")]) == 2
    said = _said(capsys)
    assert "profile.json: hardware.kind 'MYGPU' is unknown; known: " in said
    assert "--spec SPEC or --set sim.hardware=" in said
    assert not (tmp_path / "cm" / "cost_model.json").exists()


@pytest.mark.parametrize("how", ["set", "spec"])
def test_a_profile_on_a_custom_gpu_calibrates_and_a_run_with_its_rows_loads_it(
    tmp_path, capsys, how
):
    profile, cm = _profile(tmp_path / "prof"), tmp_path / "cm"
    spec_file = tmp_path / "mine.yaml"
    spec_file.write_text(yaml.safe_dump(_spec().model_dump(mode="json")))
    option = ["--set", ROWS] if how == "set" else ["--spec", str(spec_file)]
    assert main(["calibrate", str(profile), "--out", str(cm), *option]) == 0
    assert json.loads((cm / "cost_model.json").read_text())["source"]["hardware"]["kind"] == "MYGPU"
    capsys.readouterr()
    out = tmp_path / "run"
    run = ["run", str(spec_file), "--set", f"sim.cost_model=profiled:{cm}", "--out", str(out)]
    assert main(run) == 0, _said(capsys)
    assert json.loads((out / "metrics.json").read_text())["throughput_samples_per_s"] > 0


def test_a_custom_gpu_row_missing_a_figure_is_refused_by_its_key(tmp_path, capsys):
    profile = _profile(tmp_path / "prof")
    row = "sim.hardware=[{name: MYGPU, hbm_gb: 96}]"
    assert main(["calibrate", str(profile), "--out", str(tmp_path / "cm"), "--set", row]) == 2
    assert "sim.hardware.0.bf16_dense_tflops: 'MYGPU' is not in hardware.csv" in _said(capsys)


def test_flat_dotted_keys_are_refused_saying_how_to_nest_them(tmp_path, capsys):
    # docs/fidelity.md's table lists the keys dotted; a user wrote them so
    profile = _profile(tmp_path / "prof")
    info = json.loads((profile / "profile.json").read_text())
    for section in ("model", "hardware", "trainer"):
        for key, value in info.pop(section).items():
            info[f"{section}.{key}"] = value
    (profile / "profile.json").write_text(json.dumps(info))
    assert main(["calibrate", str(profile), "--out", str(tmp_path / "cm"), "--set", ROWS]) == 2
    said = _said(capsys)
    assert (
        "profile.json: flat key 'model.name' (one JSON key with a dot in it): write it nested"
        in said
    )
    assert '{"model": {"name": ...}}' in said
