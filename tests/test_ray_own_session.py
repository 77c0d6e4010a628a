"""The Ray a command starts for itself runs in a session of its own through a private
class of the pinned Ray (``ray._private.services.ConsolePopen``): the pin is checked here,
and a Ray without that class still starts, with a warning that says what is lost."""

from __future__ import annotations

import inspect
import logging
import subprocess

import pytest
import ray
from ray._private import services

from runtime.ray_session import ray_in_its_own_session


def test_the_pinned_ray_starts_its_processes_through_console_popen() -> None:
    assert ray.__version__ == "2.60.0"
    assert issubclass(services.ConsolePopen, subprocess.Popen)
    assert "ConsolePopen(" in inspect.getsource(services.start_ray_process)


def test_processes_started_in_the_block_get_a_session_of_their_own() -> None:
    original = services.ConsolePopen
    with ray_in_its_own_session():
        assert services.ConsolePopen is not original
        # the subclass passes start_new_session: the child's session is its own pid
        child = services.ConsolePopen(["sh", "-c", "ps -o sid= -p $$"], stdout=subprocess.PIPE)
        out, _ = child.communicate()
        assert int(out) == child.pid
    assert services.ConsolePopen is original


def test_a_ray_without_the_class_starts_as_before_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(services, "ConsolePopen")
    with caplog.at_level(logging.WARNING, "runtime.ray_session"), ray_in_its_own_session():
        assert not hasattr(services, "ConsolePopen")
    assert "has no ray._private.services.ConsolePopen" in caplog.text
    assert ray.__version__ in caplog.text
