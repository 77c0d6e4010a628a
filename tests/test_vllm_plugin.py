"""tandem's vLLM plugin sets the engine's busy-wait only when asked (runtime/vllm_plugin.py)."""

from __future__ import annotations

import pytest

from runtime.vllm_plugin import SPIN_ENV, set_reader_spin, spin_s_from_env


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
    import zmq
    from vllm.distributed.device_communicators import shm_broadcast as shm

    saved = shm.SpinCondition.__init__.__defaults__
    ctx = zmq.Context()
    try:
        assert set_reader_spin(0.003)
        reader = shm.SpinCondition(True, ctx, "inproc://tandem-spin-test")
        assert reader.busy_loop_s == 0.003
        reader.local_notify_socket.close(linger=0)
        reader.read_cancel_socket.close(linger=0)
        reader.write_cancel_socket.close(linger=0)
    finally:
        shm.SpinCondition.__init__.__defaults__ = saved
        ctx.term()
