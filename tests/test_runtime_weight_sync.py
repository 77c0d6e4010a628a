"""Weight packing: buckets both sides derive alike, views that round-trip every tensor."""

import torch

from runtime.weight_sync import (
    FlatBuffers,
    ParamMeta,
    WeightSender,
    params_meta,
    plan_buckets,
    unpack,
)


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(3, 4, generator=g)),
        ("b", torch.randn(5, generator=g)),
        ("c", torch.randn(2, 2, generator=g).to(torch.bfloat16)),
        ("d", torch.randn(7, generator=g)),
    ]


def test_buckets_group_consecutive_tensors_of_one_dtype_up_to_the_size_cap():
    metas = params_meta(_named())
    assert [(b.dtype, b.first, b.count, b.numel) for b in plan_buckets(metas)] == [
        ("float32", 0, 2, 17), ("bfloat16", 2, 1, 4), ("float32", 3, 1, 7),
    ]  # fmt: skip
    small = plan_buckets(metas, max_bytes=4 * 12)
    assert [(b.first, b.count) for b in small] == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_packed_tensors_unpack_to_the_same_values_and_buffers_are_reused():
    named = _named()
    sender = WeightSender()
    flats = sender.pack(named)
    metas = [ParamMeta(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]
    for (name, view), (want_name, want) in zip(unpack(metas, plan_buckets(metas), flats), named):
        assert name == want_name and torch.equal(view, want)
    assert all(a is b for a, b in zip(sender.pack(named), flats))  # no new allocation
    buffers = FlatBuffers()
    first = buffers.get(plan_buckets(metas), torch.device("cpu"))
    assert buffers.get(plan_buckets(metas), torch.device("cpu")) is first
