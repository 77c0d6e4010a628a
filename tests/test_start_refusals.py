"""A live run's start-up failures as one line naming the key (a user trial): a server slower
than ``live.startup_timeout_s``, a ``live.max_model_len`` the model cannot take, and a
``model.path`` whose config.json names no architecture. No vLLM, no model built."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import main
from runtime.errors import StartTimedOut
from runtime.procs import ServerProcess, free_port, wait_healthy


def _flat(text: str) -> str:
    return " ".join(text.split())


def _run(tmp_path: Path, capsys, *sets: str) -> tuple[int, str]:
    """``tandem run live-tiny --live --set ...``: its exit code and what it printed."""
    args = ["run", "live-tiny", "--live", "--out", str(tmp_path / "run")]
    for key in sets:
        args += ["--set", key]
    code = main(args)
    return code, _flat(capsys.readouterr().out)


@pytest.fixture
def silent_server(tmp_path: Path):
    """A "server" process that never answers ``/health`` (nothing listens on its port)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    log = tmp_path / "logs" / "server-0.log"
    try:
        yield ServerProcess(0, f"http://127.0.0.1:{free_port()}", proc, log)
    finally:
        proc.kill()
        proc.wait()


def test_a_server_not_healthy_in_time_names_its_log_and_the_key(silent_server) -> None:
    with pytest.raises(StartTimedOut) as caught:
        wait_healthy(silent_server, timeout_s=0.2)
    said = str(caught.value)
    assert said.startswith(f"generation server 0 (pid {silent_server.proc.pid}, http://")
    assert f"not healthy after 0.2 s (log: {silent_server.log_path})" in said
    assert said.endswith("raise live.startup_timeout_s")


def test_a_start_slower_than_the_timeout_is_one_error_line_not_a_traceback(
    tmp_path: Path, monkeypatch, capsys, silent_server
) -> None:
    """Before: the builtin ``TimeoutError`` (an ``OSError`` without a file name) passed
    the CLI's last layer: a 25-line traceback, no hint."""
    from runtime import launcher

    def starts_slowly(spec, *args, **kwargs) -> None:
        wait_healthy(silent_server, spec.live.startup_timeout_s)

    monkeypatch.setattr(launcher, "_run_processes", starts_slowly)
    code, printed = _run(tmp_path, capsys, "live.startup_timeout_s=0.2", "run.iterations=1")
    assert code == 1
    assert printed.startswith("error: generation server 0 (pid ")
    assert f"(log: {silent_server.log_path})" in printed
    assert printed.endswith("raise live.startup_timeout_s")


def test_a_genuine_os_error_is_not_swallowed(tmp_path: Path, monkeypatch) -> None:
    """An ``OSError`` naming no file is no user mistake: it keeps its traceback."""
    from runtime import launcher

    def fails(*args, **kwargs) -> None:
        raise ConnectionResetError(104, "Connection reset by peer")

    monkeypatch.setattr(launcher, "_run_processes", fails)
    with pytest.raises(ConnectionResetError):
        main(["run", "live-tiny", "--live", "--out", str(tmp_path / "run")])


@pytest.mark.parametrize(
    "sets",
    [
        ("workload.max_output_tokens=600",),
        # what the refusal advised before: the servers then died in start-up ~16 s later
        ("workload.max_output_tokens=600", "live.max_model_len=642"),
    ],
)
def test_a_context_the_model_cannot_hold_names_both_keys_not_a_longer_max_model_len(
    sets, tmp_path: Path, capsys
) -> None:
    """Before: "make it at least 642", which vLLM then refused (max_position_embeddings
    512 of the embedded model), its ValidationError buried in 40 lines of its log."""
    code, printed = _run(tmp_path, capsys, *sets)
    assert code == 2
    assert "the model's context (512 tokens, max_position_embeddings of its config)" in printed
    assert "cannot hold the longest prompt (42 tokens) plus workload.max_output_tokens (600)" in (
        printed
    )
    assert "lower workload.max_output_tokens to at most 470" in printed
    assert "make it at least" not in printed
    assert not (tmp_path / "run").exists()  # refused before anything starts


def test_a_max_model_len_above_the_models_context_is_refused_before_anything_starts(
    tmp_path: Path, capsys
) -> None:
    code, printed = _run(tmp_path, capsys, "live.max_model_len=1024")
    assert code == 2
    assert "live.max_model_len (1024) is longer than the model's context (512 tokens" in printed
    assert printed.endswith("make it at most 512")
    assert not (tmp_path / "run").exists()


def _model_dir(tmp_path: Path, config: dict) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_model_paths_own_context_is_the_limit(tmp_path: Path, capsys) -> None:
    model = _model_dir(tmp_path, {"model_type": "llama", "max_position_embeddings": 256})
    code, printed = _run(tmp_path, capsys, f"model.path={model}")
    assert code == 2
    assert "live.max_model_len (512) is longer than the model's context (256 tokens" in printed


def test_a_model_config_without_model_type_is_refused_naming_the_key_and_file(
    tmp_path: Path, capsys
) -> None:
    """Before: a traceback, and a retry of a failure that could not change."""
    model = _model_dir(tmp_path, {"max_position_embeddings": 512})
    code, printed = _run(tmp_path, capsys, f"model.path={model}")
    assert code == 2
    assert f"model.path {model}: {model / 'config.json'} names no model_type" in printed
    assert not (tmp_path / "run").exists()
