"""The CLI around the runs: --version, help on every option, --log-level and run.log,
``spec show`` / ``spec keys``, progress displays, and no bare prints in library code."""

from __future__ import annotations

import argparse
import ast
import io
import json
import logging
import tomllib
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from experiments import cli
from experiments.cli import build_parser, main
from experiments.progress import RunProgress
from experiments.spec_keys import spec_keys
from policies.allocation import ALLOCATION
from policies.dispatch import DISPATCH
from policies.logs import run_log
from policies.modes import MODES
from policies.predictors import PREDICTORS
from policies.records import SampleRecord, StepStats
from policies.scheduling import SCHEDULING
from policies.spec import RunSpec, load_spec
from policies.tracking import StepUpdate

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("policies", "sim", "runtime", "ranker", "experiments")


@pytest.fixture(autouse=True)
def _wide_console(monkeypatch):
    monkeypatch.setattr(cli.console, "width", 400)


def _parsers(parser: argparse.ArgumentParser, path: str = "tandem"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                assert helps.get(name), f"{path} {name}: the subcommand has no help"
                yield from _parsers(child, f"{path} {name}")


def test_every_option_of_every_subcommand_has_help():
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                continue
            if not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, "options without help: " + ", ".join(missing)


def test_version_is_the_distributions(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out.strip() == f"tandem {expected}"


def test_spec_show_prints_the_resolved_spec(capsys):
    args = ["--set", "pipeline.mode=pipeline", "--set", "run.tracking=tensorboard"]
    assert main(["spec", "show", "live-tiny", *args]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    expected = load_spec(REPO / "experiments/configs/live-tiny.yaml", [a for a in args[1::2]])
    assert shown == expected.model_dump(mode="json")
    assert shown["pipeline"]["max_lag"] == 1 and shown["run"]["tracking"] == "tensorboard"


def test_spec_show_names_a_bad_key(capsys):
    assert main(["spec", "show", "live-tiny", "--set", "run.trackin=none"]) == 2
    assert "run.trackin" in capsys.readouterr().out


def test_spec_keys_lists_every_key_with_a_description_and_its_default(capsys):
    keys = spec_keys()
    assert [k.key for k in keys if not k.description] == []
    flat = {k.key: k for k in keys}
    defaults = RunSpec().model_dump(mode="json")
    for key, k in flat.items():
        node = defaults
        for part in key.split("."):
            if not isinstance(node, dict):  # list items (N), keys of a section set to None
                break
            node = node[part]
        else:
            assert k.default == node, key
    assert flat["run.tracking"].type == "one of: none, tensorboard, wandb, mlflow"
    assert flat["cluster.generation.N.tp"].default == 1
    assert main(["spec", "keys", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["key"] for r in rows] == list(flat)
    assert main(["spec", "keys"]) == 0
    table = capsys.readouterr().out
    assert "live.keep_checkpoints" in table and "per-step metrics logger" in table


def _piped_console(monkeypatch) -> io.StringIO:
    """The CLI's stdout as a pipe of 80 columns (not a terminal)."""
    out = io.StringIO()
    monkeypatch.setattr(cli, "console", Console(file=out, width=80))
    return out


def test_spec_keys_piped_is_one_unwrapped_key_a_line(monkeypatch):
    """Seen: piped, the table wrapped key names mid-word at 80 columns
    (``policies.allocati`` / ``on``), so grep could not find them."""
    out = _piped_console(monkeypatch)
    assert main(["spec", "keys"]) == 0
    lines = out.getvalue().splitlines()
    assert [line.split("\t")[0] for line in lines] == [k.key for k in spec_keys()]
    tracking = next(line for line in lines if line.startswith("run.tracking\t"))
    assert tracking.split("\t")[1:3] == ["one of: none, tensorboard, wandb, mlflow", '"none"']


def test_spec_show_piped_keeps_a_long_value_on_its_line(monkeypatch, tmp_path):
    """``spec show > my.yaml`` wrapped a long trace path onto a line of its own: not YAML."""
    out = _piped_console(monkeypatch)
    trace = tmp_path / ("t" * 100 + ".csv")
    args = ["--set", "workload.kind=trace", "--set", f"workload.trace_path={trace}"]
    assert main(["spec", "show", "streamrl-7b", *args]) == 0
    assert yaml.safe_load(out.getvalue())["workload"]["trace_path"] == str(trace)


def test_spec_keys_offers_only_the_inflight_choices_a_spec_accepts():
    """``barrier`` is the controllers' own (updates between batches): never listed."""
    from policies.spec import load_spec

    listed = {k.key: k.type for k in spec_keys()}["pipeline.inflight"]
    assert listed == "one of: keep, abort-resubmit, drain"
    for choice in listed.removeprefix("one of: ").split(", "):
        spec = load_spec(None, ["pipeline.mode=pipeline", f"pipeline.inflight={choice}"])
        assert spec.pipeline.inflight == choice


@pytest.mark.parametrize(
    ("key", "registry"),
    [
        ("pipeline.mode", MODES),
        ("policies.dispatch", DISPATCH),
        ("policies.scheduling", SCHEDULING),
        ("policies.allocation", ALLOCATION),
        ("policies.length_predictor", PREDICTORS),
    ],
)
def test_spec_keys_lists_a_registry_backed_keys_names_from_its_registry(key, registry, capsys):
    """Before: ``str``, though pipeline.mode's description says the keys list its names."""
    listed = {k.key: k.type for k in spec_keys()}[key]
    assert listed == "one of: " + ", ".join(registry.names())
    assert main(["spec", "keys", "--format", "json"]) == 0
    rows = {r["key"]: r["type"] for r in json.loads(capsys.readouterr().out)}
    assert rows[key] == listed


def test_spec_keys_walks_lists_and_optional_sections():
    from pydantic import BaseModel, Field

    class Inner(BaseModel):
        width: int = Field(3, description="w")

    class Outer(BaseModel):
        items: list[Inner] = Field(default_factory=lambda: [Inner()], description="i")
        maybe: Inner | None = Field(None, description="m")

    rows = [(k.key, k.type, k.default) for k in spec_keys(Outer)]
    assert rows == [
        ("items", "list[Inner]", [{"width": 3}]), ("items.N.width", "int", 3),
        ("maybe", "Inner | None", None), ("maybe.width", "int", 3),
    ]  # fmt: skip


def test_log_level_before_or_after_the_command(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--out", str(out), "--set", "run.iterations=2", "--set", "algorithm.batch_size=64"]
    assert main(["run", "streamrl-7b", *args, "--log-level", "info"]) == 0
    assert "simulating streamrl-7b" in capsys.readouterr().err
    assert "simulating streamrl-7b" in (out / "run.log").read_text()
    assert main(["--log-level", "ERROR", "run", "streamrl-7b", *args]) == 0
    assert "simulating" not in capsys.readouterr().err  # quiet console, run.log still full
    assert (out / "run.log").read_text().count("simulating streamrl-7b") == 2
    assert logging.getLogger().level == logging.INFO


def test_model_path_prints_only_the_path_on_stdout(monkeypatch, capsys, tmp_path):
    import runtime.model

    def fake(seed, on_progress=None):
        for step in range(3):
            on_progress(step, 3, 1.0 / (step + 1))
        return tmp_path

    monkeypatch.setattr(runtime.model, "ensure_tiny_model", fake)
    assert main(["model", "path"]) == 0
    assert capsys.readouterr().out == f"{tmp_path}\n"


def _record(sid: int, reward: float) -> SampleRecord:
    return SampleRecord(sid, sid, sid, 0, 0, 4, 9, None, 0.0, 0.1, 0.5, 0, 0, 0, 1, reward)


def test_the_live_progress_shows_iterations_samples_reward_lag_and_what_happens_now():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200)
    stats = StepStats(0, 1, 2, 40, 0.0, 1.0, mean_reward=0.75, mean_lag=0.5)
    with RunProgress(console, "live-tiny", total=6) as bar:
        logging.getLogger("runtime.procs").info("waiting for server 0: vLLM engine start")
        assert "waiting for server 0" in bar._bar.tasks[0].description
        bar.on_step(StepUpdate(stats, (_record(0, 1.0), _record(1, 0.5)), ()))
        task = bar._bar.tasks[0]
        assert task.completed == 1 and task.total == 6
        assert task.fields["stats"] == "2 samples · reward 0.750 · lag 0.50"
    assert "reward 0.750" in buf.getvalue()


def _prints_outside_main(path: Path) -> list[int]:
    tree = ast.parse(path.read_text())
    allowed: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            allowed |= {id(n) for n in ast.walk(node)}
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"
        if id(n) not in allowed
    ]


def test_library_code_logs_and_never_prints():
    """``print`` only in the CLI's modules and in scripts' ``main`` (their output)."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name.startswith("cli"):
                continue
            found += [f"{path.relative_to(REPO)}:{line}" for line in _prints_outside_main(path)]
    assert not found, "bare prints: " + ", ".join(found)


def test_run_log_keeps_why_a_run_stopped(tmp_path, caplog):
    with pytest.raises(RuntimeError), run_log(tmp_path):
        logging.getLogger("runtime.launcher").info("step 3 done")
        raise RuntimeError("generation server 1 died\n  (exit code 9)")
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert "step 3 done" in lines[0]
    assert lines[1].endswith(
        "the run stopped: RuntimeError: generation server 1 died (exit code 9)"
    )
    assert "ERROR" in lines[1]
    # the file only: the console prints the error line itself (it was printed twice)
    assert not [r for r in caplog.records if "the run stopped" in r.getMessage()]
