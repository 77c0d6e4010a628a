"""RunSpec: validation errors name the key, ``--set`` overrides, the CLI exits 2 on a bad spec."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from experiments import cli
from experiments.cli import main
from experiments.specs import config_path
from policies.records import InflightHandling
from policies.spec import (
    RunSpec,
    SpecError,
    apply_overrides,
    load_spec,
    parse_override,
    spec_from_dict,
)

SHIPPED = ["streamrl-7b", "streamrl-32b", "streamrl-72b", "pipelinerl-7b"]


def _error(data: dict) -> str:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    return str(info.value)


# -- loading ---------------------------------------------------------------------------


def test_defaults_are_a_valid_spec():
    spec = load_spec(None)
    assert spec == RunSpec()
    assert spec.pipeline.mode == "stream-async"
    assert spec.prompts_per_iteration == spec.algorithm.batch_size // spec.algorithm.group_size


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_load(name):
    spec = load_spec(config_path(name))
    assert spec.algorithm.batch_size % spec.algorithm.group_size == 0
    assert spec.run.iterations >= 1


def test_streamrl_7b_is_the_published_setup():
    spec = load_spec(config_path("streamrl-7b"))
    assert spec.model.name == "Qwen2.5-7B"
    assert spec.algorithm.name == "ppo"
    assert spec.algorithm.batch_size == 1024
    assert spec.workload.kind == "histogram"
    assert spec.cluster.generation[0].hardware == "H800"
    assert spec.cluster.generation[0].num_gpus + spec.cluster.trainer.num_gpus == 32


def test_yaml_round_trip_is_identical():
    spec = load_spec(config_path("pipelinerl-7b"), ["pipeline.max_lag=3"])
    again = spec_from_dict(yaml.safe_load(spec.to_yaml()))
    assert again == spec


def test_missing_file_and_non_mapping_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        load_spec(bad)
    broken = tmp_path / "broken.yaml"
    broken.write_text("run: {iterations: [1,\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_spec(broken)


@pytest.mark.parametrize("text", ["", "# a spec to fill in\n\n"])
def test_an_empty_spec_file_is_refused_naming_it(tmp_path, text):
    """Seen: an empty spec file ran silently on all defaults as a run named ``run``."""
    empty = tmp_path / "empty.yaml"
    empty.write_text(text)
    with pytest.raises(SpecError, match=rf"^{empty}: empty spec file"):
        load_spec(empty)
    (tmp_path / "braces.yaml").write_text("{}\n")  # says so: all defaults
    assert load_spec(tmp_path / "braces.yaml").run.name == "run"


# -- errors name the key -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "key", "words"),
    [
        ({"pipeline": {"mdoe": "pipeline"}}, "pipeline.mdoe", "unknown key"),
        ({"pipline": {"mode": "pipeline"}}, "pipline", "unknown key"),
        ({"policies": {"elastic": {"max_extra": 2}}}, "policies.elastic.max_extra", "unknown key"),
        ({"run": {"iterations": "ten"}}, "run.iterations", "integer"),
        ({"sim": {"fast_forward": "maybe"}}, "sim.fast_forward", "boolean"),
        ({"algorithm": {"batch_size": 1.5}}, "algorithm.batch_size", "integer"),
        (
            {"cluster": {"generation": [{"num_gpus": -8}]}},
            "cluster.generation.0.num_gpus",
            "greater",
        ),
        ({"cluster": {"trainer": {"num_gpus": 0}}}, "cluster.trainer.num_gpus", "greater"),
        ({"pipeline": {"max_lag": -1}}, "pipeline.max_lag", "greater"),
        ({"policies": {"dispatch": "fastest"}}, "policies.dispatch", "unknown name 'fastest'"),
        ({"policies": {"scheduling": "sjf"}}, "policies.scheduling", "unknown name 'sjf'"),
        ({"policies": {"length_predictor": "psychic"}}, "policies.length_predictor", "unknown"),
        (
            {"policies": {"dispatch": "skewness-aware", "length_predictor": "none"}},
            "policies.length_predictor",
            "policies.dispatch 'skewness-aware'",
        ),
        ({"policies": {"allocation": "greedy"}}, "policies.allocation", "unknown name"),
        ({"policies": {"dispatch_objective": "mean"}}, "policies.dispatch_objective", "sum"),
        ({"pipeline": {"mode": "async"}}, "pipeline.mode", "unknown name 'async'"),
        ({"pipeline": {"inflight": "barrier"}}, "pipeline.inflight", "keep"),
        ({"pipeline": {"inflight": "pause"}}, "pipeline.inflight", "keep"),
        ({"algorithm": {"name": "dpo"}}, "algorithm.name", "grpo"),
        ({"algorithm": {"batch_size": 10, "group_size": 3}}, "algorithm", "multiple"),
        ({"cluster": {"generation": [{"num_gpus": 3, "tp": 2}]}}, "cluster.generation.0", "tp"),
        ({"workload": {"kind": "trace"}}, "workload", "trace_path"),
        ({"workload": {"prompt_correlation": 1.5}}, "workload.prompt_correlation", "less"),
        (
            {"workload": {"prompt_tokens_median": 100000}},
            "workload.prompt_tokens_median",
            "16-8192",
        ),
        ({"workload": {"prompt_tokens_median": 8}}, "workload.prompt_tokens_median", "16-8192"),
        (
            {"workload": {"max_output_tokens": 5000, "final_max_output_tokens": 1000}},
            "workload.final_max_output_tokens",
            "workload.max_output_tokens (5000)",
        ),
        ({"sim": {"cost_model": "magic"}}, "sim.cost_model", "roofline"),
    ],
)
def test_bad_values_are_spec_errors_naming_the_key(data, key, words):
    message = _error(data)
    assert re.search(rf"(^|; ){re.escape(key)}: ", message), message
    assert words in message


def test_several_errors_are_all_reported():
    message = _error({"pipeline": {"max_lag": -1, "mode": "nope"}, "run": {"seed": -3}})
    for key in ("pipeline.max_lag", "pipeline.mode", "run.seed"):
        assert key in message


def test_a_spec_error_is_a_value_error():
    assert issubclass(SpecError, ValueError)


# -- overrides ----------------------------------------------------------------------------


def test_parse_override_reads_values_as_yaml():
    assert parse_override("pipeline.max_lag=3") == (["pipeline", "max_lag"], 3)
    assert parse_override("sim.fast_forward=false") == (["sim", "fast_forward"], False)
    assert parse_override("pipeline.mode=one-step-async") == (
        ["pipeline", "mode"],
        "one-step-async",
    )
    assert parse_override("run.name=a=b") == (["run", "name"], "a=b")
    with pytest.raises(SpecError, match="key.path=value"):
        parse_override("pipeline.max_lag")
    with pytest.raises(SpecError, match="empty key"):
        parse_override("=3")


def test_overrides_set_nested_keys_and_list_items():
    spec = load_spec(
        config_path("streamrl-7b"),
        [
            "cluster.generation.0.num_gpus=8",
            "cluster.generation.0.hardware=H20",
            "pipeline.mode=pipeline",
            "pipeline.max_lag=2",
            "pipeline.inflight=abort-resubmit",
            "workload.max_output_tokens=20000",
            "run.iterations=3",
        ],
    )
    assert spec.cluster.generation[0].num_gpus == 8
    assert spec.cluster.generation[0].hardware == "H20"
    assert spec.cluster.trainer.num_gpus == 16  # untouched
    assert spec.pipeline.mode == "pipeline"
    assert spec.pipeline.max_lag == 2
    assert spec.pipeline.inflight == InflightHandling.ABORT_RESUBMIT
    assert spec.workload.max_output_tokens == 20000
    assert spec.run.iterations == 3


def test_override_can_replace_a_whole_list():
    spec = load_spec(
        None,
        ["cluster.generation=[{num_gpus: 4, datacenter: a}, {num_gpus: 2, hardware: H20}]"],
    )
    assert [(p.num_gpus, p.hardware, p.datacenter) for p in spec.cluster.generation] == [
        (4, "H800", "a"),
        (2, "H20", "dc0"),
    ]


def test_overrides_do_not_change_their_input():
    data = RunSpec().model_dump(mode="json")
    apply_overrides(data, ["cluster.generation.0.num_gpus=2"])
    assert data["cluster"]["generation"][0]["num_gpus"] == 16


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("cluster.generation.3.num_gpus=8", "cluster.generation.3"),
        ("cluster.generation.x.num_gpus=8", "cluster.generation.x"),
        ("pipeline.mdoe=pipeline", "pipeline.mdoe"),
        ("pipeline.max_lag=-1", "pipeline.max_lag"),
        ("cluster.generation.0.num_gpus=-8", "cluster.generation.0.num_gpus"),
        ("policies.dispatch=fastest", "policies.dispatch"),
        ("run.iterations=many", "run.iterations"),
        ("run.seed.x=1", "run.seed"),
    ],
)
def test_bad_overrides_are_spec_errors_naming_the_key(override, key):
    with pytest.raises(SpecError) as info:
        load_spec(config_path("streamrl-7b"), [override])
    assert key in str(info.value)


# -- CLI exit status 2 --------------------------------------------------------------------


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    """Rich wraps at 80 columns when not on a terminal; keep messages on one line."""
    monkeypatch.setattr(cli.console, "width", 400)


def test_cli_typo_key_exits_2_naming_it(tmp_path, capsys):
    spec = tmp_path / "typo.yaml"
    spec.write_text("run: {iterations: 1}\npipeline: {mode: stream-sync, max_lgs: 2}\n")
    out = tmp_path / "out"
    assert main(["run", str(spec), "--out", str(out)]) == 2
    printed = _flat(capsys.readouterr().out)
    assert "pipeline.max_lgs" in printed
    assert "unknown key" in printed
    assert not out.exists()  # failed before anything ran


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("pipeline.max_lag=-1", "pipeline.max_lag"),
        ("cluster.generation.0.num_gpus=-16", "cluster.generation.0.num_gpus"),
        ("policies.dispatch=fastest", "policies.dispatch"),
        ("pipline.mode=pipeline", "pipline"),
    ],
)
def test_cli_impossible_value_exits_2_naming_the_key(tmp_path, capsys, override, key):
    out = tmp_path / "out"
    assert main(["run", "streamrl-7b", "--set", override, "--out", str(out)]) == 2
    assert key in _flat(capsys.readouterr().out)
    assert not out.exists()


def test_cli_unknown_spec_file_exits_2(tmp_path, capsys):
    missing = tmp_path / "missing.yaml"
    assert main(["run", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert "missing" in _flat(capsys.readouterr().out)


def test_cli_sweep_whose_every_point_is_impossible_exits_2(tmp_path, capsys):
    code = main(
        [
            "sweep",
            "streamrl-7b",
            "--grid",
            "pipeline.max_lag=-1,-2",
            "--out",
            str(tmp_path / "sweep"),
        ]
    )
    assert code == 2
    printed = _flat(capsys.readouterr().out)
    assert "grid point pipeline.max_lag=-1: pipeline.max_lag" in printed
    assert not (tmp_path / "sweep").exists()


def test_cli_sweep_refuses_an_impossible_point_before_any_point_runs(tmp_path, capsys):
    """Seen: point 0 ran in full, then point 1 failed with a traceback in results.csv."""
    out = tmp_path / "sweep-bad"
    grid = ["--grid", "workload.max_output_tokens=5000,-1", "--grid", "run.seed=1,2"]
    args = ["sweep", "streamrl-7b", "--set", "run.iterations=1", *grid, "--out", str(out)]
    assert main(args) == 2
    printed = _flat(capsys.readouterr().out)
    assert "grid point workload.max_output_tokens=-1 run.seed=1: " in printed
    assert "workload.max_output_tokens: Input should be greater than or equal to 1" in printed
    assert len(printed.splitlines()) == 1
    assert not out.exists()  # no directory, no point run


def test_config_path_finds_files_and_shipped_names(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("{}")
    assert config_path(str(f)) == f
    assert config_path("streamrl-7b").name == "streamrl-7b.yaml"
    assert Path(config_path("streamrl-7b")).exists()
    with pytest.raises(SpecError):
        config_path("no-such-config")


def test_saved_specs_leave_the_secrets_out_and_the_run_takes_them_from_the_environment(
    monkeypatch,
):
    from runtime.attach import control_token, inference_key

    spec = load_spec(config_path("live-tiny"), ["live.token=s3cret", "live.api_key=k3y"])
    assert spec.live.token == "s3cret" and spec.live.api_key == "k3y"  # in memory, as given
    saved = spec.to_yaml()
    assert "s3cret" not in saved and "k3y" not in saved
    again = RunSpec.model_validate(yaml.safe_load(saved))
    assert again.live.token is None and again.live.api_key is None
    assert again.model_dump(exclude={"live"}) == spec.model_dump(exclude={"live"})
    assert control_token(spec.live) == "s3cret"
    monkeypatch.setenv("TANDEM_TOKEN", "from-env")
    monkeypatch.setenv("TANDEM_API_KEY", "key-env")
    assert control_token(spec.live) == "s3cret" and inference_key(spec.live) == "k3y"
    assert control_token(again.live) == "from-env" and inference_key(again.live) == "key-env"
    monkeypatch.delenv("TANDEM_TOKEN")
    monkeypatch.delenv("TANDEM_API_KEY")
    fresh = control_token(again.live)
    assert len(fresh) == 32 and fresh != control_token(again.live)  # a new one per run
    assert inference_key(again.live) is None


def test_server_urls_are_base_urls_each_once_without_a_trailing_slash():
    """Before: a server listed twice hung the run ~100 s, then a 504 (and wedged the
    server); ``URL/`` asked ``URL//init_process_group`` and got a 404."""
    again = r"server_urls\[1\] http://127.0.0.1:8470/ is server_urls\[0\] again"
    with pytest.raises(SpecError, match=again):
        load_spec(None, ["live.server_urls=[http://127.0.0.1:8470,http://127.0.0.1:8470/]"])
    with pytest.raises(SpecError, match=r"server_urls\[0\] '127.0.0.1:8470': expected a base URL"):
        load_spec(None, ["live.server_urls=[127.0.0.1:8470]"])
    spec = load_spec(None, ["live.server_urls=[http://127.0.0.1:8470/,http://127.0.0.1:8471]"])
    assert spec.live.server_urls == ["http://127.0.0.1:8470", "http://127.0.0.1:8471"]


def test_an_unset_section_is_set_key_by_key():
    """Seen: ``--set model.shape.num_params_b=7`` (``tandem spec keys`` lists it) failed
    with "cannot set a key inside a value" while model.shape was unset."""
    with pytest.raises(SpecError, match="model.shape.num_layers: Field required"):
        load_spec(None, ["model.shape.num_params_b=7"])
    keys = {"num_params_b": 7, "num_layers": 28, "hidden_size": 3584, "num_attention_heads": 28}
    spec = load_spec(None, ["model.name=mine", *(f"model.shape.{k}={v}" for k, v in keys.items())])
    assert spec.model.shape is not None and spec.model.shape.num_layers == 28
    with pytest.raises(SpecError, match="run.iterations.x: cannot set a key inside a value"):
        load_spec(None, ["run.iterations.x=3"])


@pytest.mark.parametrize("temperature", ["2.5", "inf", "1e300"])
def test_a_live_temperature_vllm_cannot_sample_with_is_a_spec_error(temperature):
    """Before: the run started and every generation request hung (vLLM samples in [0, 2])."""
    with pytest.raises(SpecError, match=r"live\.temperature") as info:
        load_spec(config_path("live-tiny"), [f"live.temperature={temperature}"])
    assert "2" in str(info.value)
