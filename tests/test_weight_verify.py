"""Verified weight updates without vLLM: the worker extension on a real gloo group.

Rank 0 (a :class:`WeightSender`) and rank 1 (a :class:`WeightReceiver` whose model runner
only records what it is asked to load) run in two threads of this process. A short
broadcast, a bad hash, a float16 update into a float32 model or a sender that sends
nothing must all leave the model untouched and name the first bad tensor; a stalled
receive must end within its deadline and the group must be re-creatable.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from runtime.control import UpdateRejected, check_digests, check_metas
from runtime.procs import free_port
from runtime.weight_group import make_group
from runtime.weight_sync import BucketDigest, WeightReceiver, WeightSender, params_meta


def _named(n: int = 21) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(f"layer{i}.weight", torch.randn(4, 3, generator=g)) for i in range(n)]


class _Runner:
    def __init__(self) -> None:
        self.loaded: list[list[str]] = []

    def reload_weights(self, weights_iterator) -> None:
        self.loaded.append([name for name, _ in weights_iterator])


def _joined() -> tuple[WeightSender, WeightReceiver]:
    """A sender and a receiver in one fresh weight group (world of 2)."""
    port = free_port()
    receiver = WeightReceiver()
    receiver.model_runner = _Runner()
    joined = threading.Thread(
        target=receiver.tandem_join, args=("127.0.0.1", port, 1, 2, "gloo", 20.0, "127.0.0.1")
    )
    joined.start()
    sender = WeightSender()
    sender.join("127.0.0.1", port, 2, "gloo", 20.0)
    joined.join()
    return sender, receiver


def _update(sender, receiver, named, sent=None, digests=None, timeout_s=10.0) -> dict:
    """The receiver's answer to an update of ``named`` while the sender broadcasts ``sent``."""
    metas = params_meta(named)
    flats = sender.pack(named)
    digests = digests or sender.digests(named, flats)
    wire = [(m.name, m.shape, m.dtype) for m in metas]
    out: dict = {}
    recv = threading.Thread(
        target=lambda: out.update(
            receiver.tandem_receive(wire, [asdict(d) for d in digests], timeout_s)
        )
    )
    recv.start()
    if sent is not None:
        sender.send(sender.pack(sent) if sent is not named else flats, timeout_s)
    recv.join()
    return out


def test_a_good_update_is_loaded():
    sender, receiver = _joined()
    named = _named()
    out = _update(sender, receiver, named, sent=named)
    assert "failure" not in out and out["load_ms"] >= 0
    assert receiver.model_runner.loaded == [[n for n, _ in named]]


def test_a_short_broadcast_is_refused_naming_the_first_tensor_not_received():
    sender, receiver = _joined()
    named = _named()
    out = _update(sender, receiver, named, sent=named[:10])  # metadata lists 21, 10 sent
    failure = out["failure"]
    assert failure["kind"] == "mismatch" and failure["field"] == "params[10]"
    assert "layer10.weight" in failure["message"] and "not received" in failure["message"]
    assert receiver.model_runner.loaded == []  # the old weights keep serving


def test_content_that_differs_from_its_hash_is_refused():
    sender, receiver = _joined()
    named = _named()
    flats = sender.pack(named)
    digests = [replace(d, blake2b="0" * 32) for d in sender.digests(named, flats)]
    out = _update(sender, receiver, named, sent=named, digests=digests)
    assert out["failure"]["field"] == "buckets[0].blake2b"
    assert "layer0.weight" in out["failure"]["message"]
    assert receiver.model_runner.loaded == []


def test_non_finite_weights_are_refused_naming_the_tensor():
    sender, receiver = _joined()
    named = _named()
    named[5] = (named[5][0], torch.full((4, 3), float("inf")))
    out = _update(sender, receiver, named, sent=named)
    assert out["failure"]["field"] == "params[5]"
    assert receiver.model_runner.loaded == []


def test_a_sender_that_sends_nothing_frees_the_worker_by_the_deadline_and_the_group_is_made_again():
    sender, receiver = _joined()
    named = _named()
    out = _update(sender, receiver, named, sent=None, timeout_s=1.0)
    assert out["failure"]["kind"] == "timeout" and "init_process_group" in out["failure"]["message"]
    assert receiver.tandem_group is None and receiver.model_runner.loaded == []
    again = receiver.tandem_receive([("x", (1,), "float32")], [], 1.0)
    assert again["failure"]["kind"] == "no-group"
    sender, receiver2 = _joined()  # a new group (the route: /init_process_group)
    receiver2.tandem_buffers, receiver2.model_runner = receiver.tandem_buffers, _Runner()
    assert "failure" not in _update(sender, receiver2, named, sent=named)


def test_the_metadata_checks_name_the_first_bad_tensor_before_any_pause():
    named = _named()
    metas = params_meta(named)
    manifest = {m.name: (m.shape, "float32") for m in metas}
    half = params_meta([(n, t.half()) for n, t in named])
    with pytest.raises(UpdateRejected, match=r"params\[0\]\.dtype: .*float16.*float32"):
        check_metas(half, manifest, "float32")
    # a trainer on a smaller model than the one served (seen live: 12 of 21 tensors taken,
    # the rest kept as they were, exit 0)
    with pytest.raises(UpdateRejected, match=r"params: 11 of the served model's 21 .*'layer10"):
        check_metas(metas[:10], manifest, "float32")
    check_metas(metas, manifest, "float32")
    flats = WeightSender().pack(named[:10])
    short = WeightSender().digests(named[:10], flats)  # the sender packs 10 of 21
    with pytest.raises(UpdateRejected, match=r"num_tensors.*params\[10\] 'layer10.weight'"):
        check_digests(metas, short)
    right = WeightSender().digests(named, WeightSender().pack(named))
    check_digests(metas, right)
    with pytest.raises(UpdateRejected, match="num_bytes"):
        check_digests(metas, [BucketDigest("float32", 21, 5, right[0].blake2b)])


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) listening on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                out.append(local.rsplit(":", 1)[0])
    return out


def test_the_trainers_store_listens_on_the_given_host_only():
    port = free_port()
    group: dict = {}
    rank0 = threading.Thread(
        target=lambda: group.update(g=make_group("127.0.0.1", port, 0, 2, "gloo", 20.0))
    )
    rank0.start()
    try:
        for _ in range(200):
            if _listening(port):
                break
            threading.Event().wait(0.02)
        assert _listening(port) == ["0100007F"]  # 127.0.0.1, not every interface
    finally:
        make_group("127.0.0.1", port, 1, 2, "gloo", 20.0)  # lets rank 0 finish
        rank0.join()


def test_updates_pause_only_engines_that_overlap_steps():
    from types import SimpleNamespace

    from runtime.control import steps_overlap

    def engine(batches):
        return SimpleNamespace(vllm_config=SimpleNamespace(max_concurrent_batches=batches))

    assert not steps_overlap(engine(1))  # a utility call runs between two steps
    assert steps_overlap(engine(2))  # async scheduling or pipeline parallel: pause first
    assert steps_overlap(SimpleNamespace())  # unknown engine: pause
