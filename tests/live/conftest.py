"""One real vLLM server (tiny model, CPU) shared by the whole live test session."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from runtime.model import ensure_tiny_model
from runtime.procs import free_port, split_cores, start_server, stop_server, wait_healthy


@pytest.fixture(scope="session")
def model_dir() -> str:
    return str(ensure_tiny_model(0))


@pytest.fixture(scope="session")
def token() -> str:
    return secrets.token_hex(8)


@pytest.fixture(scope="session")
def server_process(model_dir, token, tmp_path_factory):
    """A running server (runtime.procs.ServerProcess); stopped at the end of the session."""
    gen_cores, _ = split_cores(1)
    log_dir = Path(tmp_path_factory.mktemp("server-logs"))
    proc = start_server(
        0, model_dir, "127.0.0.1", free_port(), token, gen_cores, 1.0, 512, 64, log_dir
    )
    try:
        wait_healthy(proc, timeout_s=float(os.environ.get("TANDEM_SERVER_TIMEOUT_S", "400")))
        yield proc
    finally:
        stop_server(proc)


@pytest.fixture(scope="session")
def server(server_process) -> str:
    """The base URL of the session's server (its token: the ``token`` fixture)."""
    return server_process.base_url
