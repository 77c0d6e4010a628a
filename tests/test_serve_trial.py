"""What a live-side user trial found in ``tandem serve`` and the command line's errors.

Before: ``tandem serve`` left its engine unpinned, so a run attached to it (the documented
fast path) generated ~6x slower a step than with its own server, its engine's threads
fighting the trainer's core; ``--max-model-len`` above the model's context failed after
~14 s with vLLM's traceback; any failure to bind was "already in use"; and an error
holding ``[...]`` lost it to rich's markup (``(given: )``) or crashed on it."""

from __future__ import annotations

import json
import os

import pytest

from experiments import cli
from experiments.cli import main
from experiments.specs import config_path
from policies.spec import load_spec
from runtime.launcher import check_live_run
from runtime.procs import split_cores

NOT_HERE = "10.255.255.1"  # an address of no interface of this machine (no DNS asked)


def _flat(text: str) -> str:
    return " ".join(text.split())


def _model(tmp_path, context: int = 512):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "max_position_embeddings": context})
    )
    return str(tmp_path)


def _exec_env(monkeypatch, argv: list[str]) -> dict:
    seen: dict = {}

    def execve(path, args, env):
        seen.update(env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        cli.main(argv)
    return seen


def test_serve_pins_its_engine_as_a_runs_own_server(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    model = _model(tmp_path)
    env = _exec_env(monkeypatch, ["serve", model, "--token", "t", "--port", "8998"])
    first_half = ",".join(map(str, split_cores(1)[0]))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == first_half
    assert env["TANDEM_ENGINE_CORES"] == first_half
    core = str(min(os.sched_getaffinity(0)))
    env = _exec_env(monkeypatch, ["serve", model, "--token", "t", "--cores", core])
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == core
    env = _exec_env(monkeypatch, ["serve", model, "--token", "t", "--cores", "all"])
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env and "TANDEM_ENGINE_CORES" not in env


def test_serve_refuses_cores_it_cannot_use_and_a_context_beyond_the_model(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("the server started"))
    model = _model(tmp_path, context=512)
    with pytest.raises(SystemExit) as exited:
        main(["serve", model, "--token", "t", "--cores", "4096"])
    assert exited.value.code == 2
    assert "expected 'all' or a comma list of cores" in _flat(capsys.readouterr().err)
    assert main(["serve", model, "--token", "t", "--max-model-len", "99999"]) == 2
    said = _flat(capsys.readouterr().out)
    assert "--max-model-len (99999) is longer than the model's context (512 tokens" in said


def test_an_address_not_on_this_machine_is_named_not_called_a_port_in_use(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("the server started"))
    assert main(["serve", _model(tmp_path), "--token", "t", "--host", NOT_HERE]) == 2
    said = _flat(capsys.readouterr().out)
    assert f"serve: --host '{NOT_HERE}': a server cannot listen there" in said
    assert "already in use" not in said
    spec = load_spec(config_path("live-tiny"), ["live.host=" + NOT_HERE])
    with pytest.raises(ValueError, match=rf"live.host '{NOT_HERE}': a server cannot listen"):
        check_live_run(spec)
    attached = load_spec(
        config_path("live-tiny"), ["live.host=" + NOT_HERE, "live.server_urls=[http://h:1]"]
    )
    check_live_run(attached)  # it starts no server: live.host is not its to bind


def test_errors_show_brackets_as_typed_on_one_line(tmp_path, capsys):
    assert main(["spec", "show", "live-tiny", "--set", "algorithm.batch_size=[x]"]) == 2
    out = capsys.readouterr().out
    assert "(given: [x])" in out and len(out.strip().splitlines()) == 1
    missing = tmp_path / "exp[v2]" / "spec.yaml"
    assert main(["run", str(missing)]) == 2
    assert f"spec file '{missing}' does not exist" in _flat(capsys.readouterr().out)
    odd = tmp_path / "[" / "x]" / "a.yaml"  # before: rich.errors.MarkupError, exit 1
    assert main(["run", str(odd)]) == 2
    assert str(odd) in _flat(capsys.readouterr().out)


@pytest.mark.parametrize(
    "argv",
    [["run", "streamrl-7b"], ["reproduce", "streamrl"], ["export", "runs/x"], ["advise", "x"]],
)
def test_an_empty_out_is_refused_not_read_as_none_or_here(argv, capsys):
    """Before: ``tandem run live-tiny --out ""`` (``--out "$UNSET"``) ran into its default
    directory, and a required ``--out`` read ``""`` as the working directory."""
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--out", ""])
    assert exited.value.code == 2
    assert "argument --out: expected a path, got ''" in _flat(capsys.readouterr().err)
