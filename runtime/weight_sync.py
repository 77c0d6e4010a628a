"""Weight broadcast between the trainer (rank 0) and vLLM workers (ranks 1..N).

A second process group beside vLLM's own, built directly from a ``TCPStore``
(``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU) without touching the default
group. Tensors travel in checkpoint layout (Hugging Face names and shapes) in the order
the update request lists them, packed into flat *buckets*: consecutive tensors of one
dtype, up to ``BUCKET_BYTES`` each, one broadcast per bucket (one in all for a small
model). Both sides derive the same buckets from the metadata (:func:`plan_buckets`) and
keep their flat buffers between updates, so an update costs no per-tensor allocation
and no per-tensor collective.

:class:`WeightReceiver` is a vLLM ``worker_extension_cls``: its methods run inside the
worker through ``collective_rpc``. It receives every bucket first and loads the weights
only when all arrived and are finite, so a failed update leaves the previous weights
serving. It alternates between two sets of receive buffers, so the set last loaded is
never overwritten: per-tensor checksums of the served weights are computed from it on
request, not inside the pause.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BUCKET_BYTES = 512 * 2**20  # at most this many bytes per broadcast


@dataclass(slots=True, frozen=True)
class ParamMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str  # a key of DTYPES

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(slots=True, frozen=True)
class Bucket:
    """Tensors ``first .. first + count - 1`` of the update, packed flat in one dtype."""

    dtype: str
    first: int
    count: int
    numel: int


def plan_buckets(metas: Sequence[ParamMeta], max_bytes: int = BUCKET_BYTES) -> list[Bucket]:
    """Consecutive same-dtype tensors, each bucket at most ``max_bytes`` (or one tensor)."""
    out: list[Bucket] = []
    for i, m in enumerate(metas):
        size = DTYPES[m.dtype].itemsize
        last = out[-1] if out else None
        if last and last.dtype == m.dtype and (last.numel + m.numel) * size <= max_bytes:
            out[-1] = Bucket(m.dtype, last.first, last.count + 1, last.numel + m.numel)
        else:
            out.append(Bucket(m.dtype, i, 1, m.numel))
    return out


def tensor_checksum(t: torch.Tensor) -> tuple[float, float]:
    """(sum, sum of squares) in float64: equal tensors give equal checksums."""
    x = t.detach().to("cpu", torch.float64)
    return float(x.sum()), float((x * x).sum())


def make_group(
    host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
) -> torch.distributed.ProcessGroup:
    """Join (rank 0: host) the weight group; blocks until every rank has joined."""
    timeout = timedelta(seconds=timeout_s)
    store = torch.distributed.TCPStore(
        host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False
    )
    if backend == "nccl":
        return torch.distributed.ProcessGroupNCCL(store, rank, world_size)
    if backend != "gloo":
        raise ValueError(f"backend must be 'gloo' or 'nccl', not {backend!r}")
    return torch.distributed.ProcessGroupGloo(store, rank, world_size, timeout)


def broadcast(group: torch.distributed.ProcessGroup, tensor: torch.Tensor) -> None:
    opts = torch.distributed.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


class FlatBuffers:
    """One flat tensor per bucket, reused while the layout stays the same."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.flats: list[torch.Tensor] = []

    def get(self, buckets: list[Bucket], device: torch.device) -> list[torch.Tensor]:
        key = (tuple(buckets), str(device))
        if key != self._key:
            self.flats = [
                torch.empty(b.numel, dtype=DTYPES[b.dtype], device=device) for b in buckets
            ]
            self._key = key
        return self.flats


def unpack(
    metas: Sequence[ParamMeta], buckets: list[Bucket], flats: list[torch.Tensor]
) -> list[tuple[str, torch.Tensor]]:
    """(name, view into its bucket) for every tensor, in update order."""
    out = []
    for b, flat in zip(buckets, flats):
        offset = 0
        for m in metas[b.first : b.first + b.count]:
            out.append((m.name, flat[offset : offset + m.numel].view(m.shape)))
            offset += m.numel
    return out


class WeightSender:
    """The trainer side: rank 0 of the weight group."""

    def __init__(self) -> None:
        self._group: torch.distributed.ProcessGroup | None = None
        self.device = torch.device("cpu")
        self._buffers = FlatBuffers()

    def join(self, host: str, port: int, world_size: int, backend: str, timeout_s: float) -> None:
        self._group = make_group(host, port, 0, world_size, backend, timeout_s)
        self.device = torch.device("cuda" if backend == "nccl" else "cpu")

    @property
    def joined(self) -> bool:
        return self._group is not None

    def pack(self, named: Sequence[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
        """Copy the tensors into the flat buckets (before asking servers to pause)."""
        metas = params_meta(named)
        buckets = plan_buckets(metas)
        flats = self._buffers.get(buckets, self.device)
        with torch.no_grad():
            for (_, view), (_, t) in zip(unpack(metas, buckets, flats), named):
                view.copy_(t)
        return flats

    def send(self, flats: Sequence[torch.Tensor]) -> None:
        if self._group is None:
            raise RuntimeError("join the weight group before sending")
        for flat in flats:
            broadcast(self._group, flat)


def params_meta(named: Sequence[tuple[str, torch.Tensor]]) -> list[ParamMeta]:
    return [ParamMeta(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in named]


class WeightReceiver:
    """vLLM worker extension: join the weight group, receive and load a weight version."""

    def tandem_join(
        self, host: str, port: int, rank: int, world_size: int, backend: str, timeout_s: float
    ) -> bool:
        self.tandem_group = make_group(host, port, rank, world_size, backend, timeout_s)
        self.tandem_buffers = (FlatBuffers(), FlatBuffers())  # receive into the one not loaded
        self.tandem_next = 0
        return True

    def _tandem_device(self) -> torch.device:
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")

    def tandem_receive(self, wire: Sequence[tuple[str, tuple[int, ...], str]]) -> dict:
        """Receive every bucket, check, then load; returns the stages' durations (ms)."""
        group = getattr(self, "tandem_group", None)
        if group is None:
            raise RuntimeError("no weight group: call /init_process_group first")
        t0 = time.perf_counter()
        metas = [ParamMeta(n, tuple(s), d) for n, s, d in wire]
        buckets = plan_buckets(metas)
        flats = self.tandem_buffers[self.tandem_next].get(buckets, self._tandem_device())
        for flat in flats:
            broadcast(group, flat)
        t1 = time.perf_counter()
        if not all(bool(torch.isfinite(flat).all()) for flat in flats):
            raise ValueError("non-finite weights received; update not loaded")
        t2 = time.perf_counter()
        self.model_runner.reload_weights(weights_iterator=iter(unpack(metas, buckets, flats)))
        t3 = time.perf_counter()
        self.tandem_loaded = (metas, buckets, flats)  # never received into until replaced
        self.tandem_next = 1 - self.tandem_next
        return {
            "receive_ms": (t1 - t0) * 1e3,
            "check_ms": (t2 - t1) * 1e3,
            "load_ms": (t3 - t2) * 1e3,
        }

    def tandem_checksums(self) -> dict:
        loaded = getattr(self, "tandem_loaded", None)
        if loaded is None:
            return {}
        return {n: tensor_checksum(t) for n, t in unpack(*loaded)}
