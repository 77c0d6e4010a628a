"""``tandem serve`` refuses what would fail later or open its control routes to anyone."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from experiments import cli
from experiments.cli import main

REPO = Path(__file__).resolve().parents[1]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_serve_refuses_to_open_control_routes_without_a_token(monkeypatch, capsys):
    import runtime.server

    def started(*args, **kwargs):
        raise AssertionError("a server started without a token")

    monkeypatch.setattr(runtime.server, "serve_main", started)
    monkeypatch.setattr(os, "execve", started)
    monkeypatch.delenv("TANDEM_TOKEN", raising=False)
    assert main(["serve", str(REPO)]) == 2
    printed = _flat(capsys.readouterr().out)
    assert "--token" in printed and "--insecure-no-token" in printed


def test_serve_refuses_a_directory_that_is_not_a_model_or_a_port_in_use(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(os, "execve", lambda *a: pytest.fail("the server started"))
    assert main(["serve", str(tmp_path), "--token", "t"]) == 2
    assert f"{tmp_path} has no config.json: not a Hugging Face model" in _flat(
        capsys.readouterr().out
    )
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with socket.socket() as taken:  # before: vLLM's traceback 12 s later
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(tmp_path), "--token", "t", "--port", str(port)]) == 2
    assert f"127.0.0.1:{port} is already in use" in _flat(capsys.readouterr().out)


def test_serve_execs_the_server_with_the_token_out_of_its_command_line(monkeypatch, tmp_path):
    seen: dict = {}
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')

    def execve(path, argv, env):
        seen.update(argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    with pytest.raises(SystemExit):
        cli.main(["serve", str(tmp_path), "--token", "s3cret", "--port", "8999",
                  "--max-model-len", "1024", "--kv-cache-gib", "0.25"])  # fmt: skip
    assert seen["argv"][1:4] == ["-m", "runtime.server", str(tmp_path)]
    argv = seen["argv"]
    assert argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
    assert argv[argv.index("--kv-cache-gib") + 1] == "0.25"
    assert "s3cret" not in " ".join(seen["argv"]) and seen["env"]["TANDEM_TOKEN"] == "s3cret"


def test_exit_without_finalizing_flushes_output_and_skips_the_interpreters_finalisation():
    """A stopped server leaves the interpreter at once: Triton's nanobind bindings (loaded
    by vLLM) list hundreds of "leaked" types into its log at finalisation."""
    import subprocess
    import sys

    child = (
        "import atexit, logging, sys\n"
        "from runtime.lifetime import exit_without_finalizing\n"
        "atexit.register(lambda: print('FINALISED', file=sys.stderr))\n"
        "logging.basicConfig(stream=sys.stderr)\n"
        "logging.warning('logged before the exit')\n"
        "print('written, not yet flushed', end='')\n"
        "exit_without_finalizing(3)\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          cwd=root, timeout=60)  # fmt: skip
    assert done.returncode == 3
    assert done.stdout == "written, not yet flushed"
    assert "logged before the exit" in done.stderr
    assert "FINALISED" not in done.stderr


def test_the_server_exits_without_finalizing_once_it_has_served(monkeypatch):
    import runtime.server as server

    seen = []
    monkeypatch.setattr(server, "serve_main", lambda *a, **k: seen.append("served"))
    monkeypatch.setattr(server, "exit_without_finalizing", lambda code: seen.append(code))
    monkeypatch.setattr("sys.argv", ["runtime.server", "model", "--token", "t"])
    server.main()
    assert seen == ["served", 0]
