"""tandem's vLLM plugin sets the engine's busy-wait only when asked (runtime/vllm_plugin.py)."""

from __future__ import annotations

import inspect

import pytest

from runtime.vllm_plugin import RECHECK_MS, SPIN_ENV, set_reader_spin, spin_s_from_env


def test_spin_from_env_reads_milliseconds_and_is_none_when_unset():
    assert spin_s_from_env({}) is None
    assert spin_s_from_env({SPIN_ENV: ""}) is None
    assert spin_s_from_env({SPIN_ENV: "2"}) == pytest.approx(0.002)
    assert spin_s_from_env({SPIN_ENV: "0"}) == 0.0


@pytest.mark.parametrize("bad", ["fast", "-1", "nan"])
def test_spin_from_env_names_the_variable_on_bad_values(bad):
    with pytest.raises(ValueError, match=SPIN_ENV):
        spin_s_from_env({SPIN_ENV: bad})


def test_readers_built_after_the_plugin_spin_what_it_set():
    """What a new reader gets is its constructor's default (a real reader needs a zmq
    context, whose teardown aborted now and then in a test process holding vLLM; the
    engine's own readers are checked live: tests/live/test_engine_spin.py)."""
    from vllm.distributed.device_communicators import shm_broadcast as shm

    saved = shm.SpinCondition.__init__.__defaults__, shm.SHM_READER_RECHECK_INTERVAL_MS
    try:
        assert set_reader_spin(0.003)
        params = inspect.signature(shm.SpinCondition.__init__).parameters
        assert params["busy_loop_s"].default == 0.003
        assert params["is_reader"].default is inspect.Parameter.empty  # the others kept
        assert shm.SHM_READER_RECHECK_INTERVAL_MS == RECHECK_MS
    finally:
        shm.SpinCondition.__init__.__defaults__, shm.SHM_READER_RECHECK_INTERVAL_MS = saved
