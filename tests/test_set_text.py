"""``--set`` and ``--grid`` take the text as typed for a key that holds text.

Before: every value was read as YAML, so ``run.name=007`` became ``7``, ``run.name=on``
``True`` and ``cluster.generation.0.datacenter=no`` failed with "Input should be a valid
string", no hint of what YAML had made of it."""

from __future__ import annotations

import pytest

from experiments.cli import main
from experiments.specs import config_path
from experiments.sweep import parse_grid
from experiments.sweep_point import point_spec
from policies.spec import RunSpec, SpecError, load_spec, parse_override
from policies.spec_fields import field_annotation, takes_text


@pytest.mark.parametrize("typed", ["007", "1.10", "on", "no", "1e3", "0x1F", "2024-01-01"])
def test_a_text_key_keeps_the_value_as_typed(typed):
    spec = load_spec(None, [f"run.name={typed}", f"cluster.generation.0.datacenter={typed}"])
    assert spec.run.name == typed
    assert spec.cluster.generation[0].datacenter == typed


def test_other_keys_still_read_yaml():
    spec = load_spec(
        None, ["run.iterations=007", "sim.fast_forward=off", "live.server_urls=[http://h:1]"]
    )
    assert (spec.run.iterations, spec.sim.fast_forward) == (7, False)
    assert spec.live.server_urls == ["http://h:1"]


def test_a_quoted_value_is_unquoted_and_null_unsets_an_optional_text_key():
    assert parse_override("run.name='007'", RunSpec) == (["run", "name"], "007")
    assert parse_override('run.name="on"', RunSpec) == (["run", "name"], "on")
    spec = load_spec(None, ["model.path=/m", "model.path=null", "model.config=~"])
    assert (spec.model.path, spec.model.config) == (None, None)
    assert load_spec(None, ["model.name=it's"]).model.name == "it's"


def test_the_walk_finds_list_items_optional_sections_and_literals():
    def text(key: str) -> bool | None:
        annotation = field_annotation(RunSpec, key.split("."))
        return None if annotation is None else takes_text(annotation)

    assert text("cluster.generation.3.hardware") is True  # any list index: the item's type
    assert text("model.shape.num_layers") is False  # inside a section that may be None
    assert text("run.tracking") is True  # a Literal of strings
    assert text("pipeline.max_lag") is False and text("live.server_urls") is False
    assert text("run.nope") is None and text("run.name.deeper") is None


def test_a_refused_value_names_the_key_and_shows_it_as_typed(capsys):
    assert main(["spec", "show", "streamrl-7b", "--set", "run.iterations=1.10"]) == 2
    said = " ".join(capsys.readouterr().out.split())
    assert said.startswith("spec error: run.iterations: ")
    assert said.endswith("(given: 1.10)")
    with pytest.raises(SpecError, match=r"'1\.10/x' must be a directory name"):
        load_spec(None, ["run.name=1.10/x"])


def test_yaml_text_that_reads_as_a_number_says_to_quote_it():
    """A section set as YAML (or a spec file) keeps YAML's typing; the message says so."""
    with pytest.raises(SpecError) as info:
        load_spec(None, ["cluster.trainer={datacenter: no}"])
    assert "cluster.trainer.datacenter: Input should be a valid string" in str(info.value)
    assert "(YAML read it as the boolean False: quote it to keep it as text)" in str(info.value)


def test_a_grid_of_a_text_key_keeps_each_value_and_its_points_run_it():
    axis = parse_grid("run.name=007, on,x")
    assert axis.values == (("007",), ("on",), ("x",))
    base = load_spec(config_path("streamrl-7b"))
    names = [point_spec(base, {"run.name": v}).run.name for (v,) in axis.values]
    assert names == ["007", "on", "x"]
    linked = parse_grid("cluster.trainer.datacenter,run.seed=010:010")
    assert linked.values == (("010", 8),)  # YAML 1.1 reads 010 as octal, for a number


def test_a_spec_file_keeps_a_text_key_as_written(tmp_path):
    """Before: a spec file's ``name: 007`` ran as ``7`` and ``datacenter: no`` was refused."""
    path = tmp_path / "s.yaml"
    path.write_text(
        "run: {name: 007, iterations: 007}\n"
        "model: {name: 1.10, path: ~}\n"
        "cluster:\n"
        "  generation: [{hardware: H800, num_gpus: 8, datacenter: no}]\n"
        "  trainer: {hardware: H800, num_gpus: 8, datacenter: '2024-01-01'}\n"
        "sim: {fast_forward: off}\n"
    )
    spec = load_spec(path)
    assert (spec.run.name, spec.run.iterations) == ("007", 7)
    assert (spec.model.name, spec.model.path) == ("1.10", None)
    assert spec.cluster.generation[0].datacenter == "no"
    assert spec.cluster.trainer.datacenter == "2024-01-01"
    assert spec.sim.fast_forward is False
    path.write_text("run: {name: a, name: b}\n")
    with pytest.raises(SpecError, match="duplicate key 'name'"):
        load_spec(path)
